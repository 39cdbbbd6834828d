// A weightless, deterministic Model for scheduler tests.
//
// Each token's K slot stores the token id. The logits row of a token at position p depends on
// the whole sequence up to p, read back through the lane's page table:
//   next = (31 * token + 7 * p + sum_{i<=p} token_i * (i % 13 + 1)) mod vocab
// and the distribution peaks there (next: +6, next+1: +4, next+2: +3, everything else 0).
// Outputs therefore depend on sequence content only, never on the lane or on what else is in
// the batch, and any page-table mix-up changes them. The model also checks the BatchPlan
// contract (start_pos continuity per lane, page coverage, token counts) and throws
// std::logic_error on a violation, so scheduler bugs fail loudly.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "cache/kv_pool.h"
#include "models/model.h"

namespace ninfer {

class ToyModel final : public Model {
 public:
  ToyModel(int64_t vocab_size, KvPool& pool, int max_lanes, int64_t max_positions = 4096);

  const ModelInfo& info() const override { return info_; }
  void forward(const BatchPlan& plan, float* logits) override;
  void reset_lane(int lane) override;
  void keep_prefix(int lane, int32_t length) override;
  void resume_lane(int lane, int32_t position, int slot) override;
  void kv_page_io(int32_t page, void* host, bool to_host) override { kv_page_io_host(pool_, page, host, to_host); }
  // Off unless a test turns it on: then the toy "samples on its device" with the host
  // reference (sample_row_on_host), so the engine's device-sampling path runs on the CPU.
  bool samples_on_device() const override { return samples_on_device_; }
  void forward_sampled(const BatchPlan& plan, const SamplingBatch& sampling, int32_t* ids) override;

  // KV geometry the toy needs from its pool: one layer, one head, one value per token.
  static constexpr int64_t kLayers = 1, kHeads = 1, kHeadDim = 1;
  // Test hook (any thread): the next `count` forwards throw std::runtime_error.
  void fail_next_forwards(int count) { failures_to_inject_ = count; }
  // Test hook (any thread): every forward sleeps this long, to keep lanes busy on purpose.
  void set_step_delay_us(int64_t us) { step_delay_us_ = us; }
  int64_t forwards() const { return forwards_; }
  // Test hook (worker idle): see samples_on_device.
  void set_samples_on_device(bool on) { samples_on_device_ = on; }
  // Test hook (any thread): every logit of the next `count` logit rows becomes `value` (a NaN
  // or infinity, to reach the samplers' errors).
  void poison_next_rows(int count, float value) {
    poison_value_ = value;
    rows_to_poison_ = count;
  }

 private:
  int32_t next_token(const SeqSlice& slice, int32_t pos) const;

  ModelInfo info_;
  KvPool& pool_;
  std::vector<int32_t> lane_positions_;  // tokens each lane has cached, to check start_pos
  std::atomic<int> failures_to_inject_{0};
  std::atomic<int64_t> forwards_{0};
  std::atomic<int64_t> step_delay_us_{0};
  std::atomic<bool> samples_on_device_{false};
  std::atomic<int> rows_to_poison_{0};
  std::atomic<float> poison_value_{0.0f};
};

}  // namespace ninfer
