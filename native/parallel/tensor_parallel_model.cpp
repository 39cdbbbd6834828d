#include "parallel/tensor_parallel_model.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "artifact/artifact.h"
#include "cache/kv_pool.h"
#include "parallel/collective.h"
#include "parallel/tensor_parallel.h"

namespace ninfer {

namespace {

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(const Artifact& artifact, KvPool& pool, const ModelOptions& options,
                      const RankModelFactory& make_rank)
      : collectives_(make_cpu_collective_group(options.tensor_parallel_size)) {
    const int size = options.tensor_parallel_size;
    if (options.device != "cpu")
      throw std::runtime_error("--tensor-parallel-size " + std::to_string(size) + " runs on --device cpu in this build; "
                               "the NCCL group for " + options.device + " is not built yet");
    ranks_.resize(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) ranks_[static_cast<size_t>(r)] = {r, size, collectives_[static_cast<size_t>(r)].get()};
    const TensorParallelRank& probe = ranks_[0];
    // Every architecture names its query heads so (the hybrid models: the attention layers').
    const int64_t heads = artifact.config().get_int("num_attention_heads", 0);
    const int64_t kv_heads = probe.kv_heads(heads, pool.num_kv_heads());
    for (int r = 0; r < size; ++r) {
      auto rank_pool =
          std::make_unique<KvPool>(pool.num_pages(), pool.num_layers(), kv_heads, pool.head_dim(), pool.kv_dtype());
      // --kv-capacity auto: the engine's pool is sized (once) for whole pages; every rank's
      // pool then takes that page count. The ranks share the host memory the sizer measured.
      rank_pool->set_sizer([&pool, per_page = rank_pool->page_bytes(1)](int64_t available, int64_t page_bytes) {
        pool.resolve_size(available, std::max<int64_t>(page_bytes / std::max<int64_t>(per_page, 1), 1));
        return pool.num_pages();
      });
      pools_.push_back(std::move(rank_pool));
    }
    for (int r = 0; r < size; ++r) {
      ModelOptions rank_options = options;
      rank_options.tensor_parallel = &ranks_[static_cast<size_t>(r)];
      const int threads = options.threads > 0 ? options.threads
                                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      rank_options.threads = std::max(1, threads / size);
      models_.push_back(make_rank(artifact, *pools_[static_cast<size_t>(r)], rank_options));
    }
    for (const auto& p : pools_)
      if (p->num_pages() != pool.num_pages())
        throw std::logic_error("tensor parallel: a rank's KV pool disagrees with the engine's page count");
    scratch_logits_.resize(static_cast<size_t>(size));
  }

  const ModelInfo& info() const override { return models_[0]->info(); }

  void forward(const BatchPlan& plan, float* logits) override {
    const auto floats = static_cast<size_t>(plan.num_logit_rows() * info().vocab_size);
    on_every_rank([&](int r) {
      if (r == 0) return models_[0]->forward(plan, logits);
      auto& scratch = scratch_logits_[static_cast<size_t>(r)];
      if (scratch.size() < floats) scratch.resize(floats);
      models_[static_cast<size_t>(r)]->forward(plan, scratch.data());
    });
  }

  void reset_lane(int lane) override {
    for (auto& m : models_) m->reset_lane(lane);
  }
  // A speculative round's rollback: every rank holds its heads' share of the lane's state.
  void keep_prefix(int lane, int32_t length) override {
    for (auto& m : models_) m->keep_prefix(lane, length);
  }
  bool has_recurrent_state() const override { return models_[0]->has_recurrent_state(); }
  int snapshot_slots() const override { return models_[0]->snapshot_slots(); }
  void save_snapshot(int lane, int slot) override {
    for (auto& m : models_) m->save_snapshot(lane, slot);
  }
  void resume_lane(int lane, int32_t position, int slot) override {
    for (auto& m : models_) m->resume_lane(lane, position, slot);
  }

 private:
  // Runs fn(rank) on one thread per rank (rank 0 on the caller's) and rethrows the first
  // failure. Every rank validates the same plan before its first collective, so a bad plan
  // fails on all of them alike instead of leaving some waiting in a collective.
  template <class Fn>
  void on_every_rank(Fn&& fn) {
    std::vector<std::exception_ptr> errors(models_.size());
    std::vector<std::thread> threads;
    for (size_t r = 1; r < models_.size(); ++r)
      threads.emplace_back([&, r] {
        try {
          fn(static_cast<int>(r));
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    try {
      fn(0);
    } catch (...) {
      errors[0] = std::current_exception();
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  std::vector<std::unique_ptr<Collective>> collectives_;
  std::vector<TensorParallelRank> ranks_;
  std::vector<std::unique_ptr<KvPool>> pools_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<std::vector<float>> scratch_logits_;
};

}  // namespace

std::unique_ptr<Model> make_tensor_parallel_model(const Artifact& artifact, KvPool& pool, const ModelOptions& options,
                                                  const RankModelFactory& make_rank) {
  return std::make_unique<TensorParallelModel>(artifact, pool, options, make_rank);
}

}  // namespace ninfer
