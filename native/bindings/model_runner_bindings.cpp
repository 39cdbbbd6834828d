// A minimal single-process driver of a Model for tests and benchmarks: owns the artifact, a
// KV pool and one page table per lane, and runs plans built from Python lists.
// The engine has its own scheduler; this exists so model numerics can be checked directly.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "artifact/artifact.h"
#include "bindings/bindings.h"
#include "cache/kv_pool.h"
#include "models/model.h"
#include "models/qwen3_5.h"

namespace py = pybind11;

namespace ninfer::bindings {

namespace {

class ModelRunner {
 public:
  ModelRunner(const std::string& path, int max_lanes, int max_batch_tokens, int threads, int max_context,
              const std::string& device, int64_t random_weights_seed, const std::string& random_weights_dtype,
              int64_t proposal_vocab, int max_verify_tokens, const std::string& kv_dtype,
              int snapshot_slots)
      : artifact_(Artifact::open(path)), max_context_(max_context) {
    if (max_lanes <= 0 || max_batch_tokens <= 0 || max_context <= 0)
      throw py::value_error("max_lanes, max_batch_tokens and max_context must be positive");
    const KvGeometry g = kv_geometry(*artifact_);
    const int64_t pages_per_lane = (max_context + kPageTokens - 1) / kPageTokens;
    kv_ = std::make_unique<KvPool>(pages_per_lane * max_lanes, g.num_kv_layers, g.num_kv_heads, g.head_dim,
                                   kv_dtype_from_name(kv_dtype));
    ModelOptions options;
    options.max_lanes = max_lanes;
    options.max_batch_tokens = max_batch_tokens;
    options.threads = threads;
    options.device = device;
    options.random_weights_seed = random_weights_seed;
    options.random_weights_dtype = random_weights_dtype;
    options.proposal_vocab = proposal_vocab;
    options.max_verify_tokens = max_verify_tokens;
    options.snapshot_slots = snapshot_slots;
    model_ = load_model(*artifact_, *kv_, options);
    lanes_.resize(static_cast<size_t>(max_lanes));
  }

  const ModelInfo& info() const { return model_->info(); }
  int64_t kv_page_bytes() const {
    return kv_->has_storage() ? kv_->page_bytes(row_bytes(kv_->storage().dtype, 1)) : 0;
  }

  using Slices = std::vector<std::tuple<int, int, std::vector<int32_t>>>;

  // Runs several lanes' slices in one traversal; returns logits [rows, vocab] where each slice
  // contributes its last token's row (or all rows with all_logits).
  py::array_t<float> forward_batch(const Slices& items, bool all_logits) {
    std::vector<int32_t> tokens;
    const BatchPlan plan = make_plan(items, all_logits, tokens);
    const int64_t vocab = model_->info().vocab_size;
    py::array_t<float> logits({static_cast<py::ssize_t>(plan.num_logit_rows()), static_cast<py::ssize_t>(vocab)});
    float* out = logits.mutable_data();
    {
      py::gil_scoped_release release;
      model_->forward(plan, out);
    }
    advance(items);
    return logits;
  }

  // The same traversal, but each slice's last row is sampled on the model's device with its
  // row of `rows` (dicts as for _core.sample_rows_host); returns the ids (or -1 / -2 codes).
  // With verify, every slice is a speculative verification round: all its rows are sampled
  // and the model keeps the per-token state history (ModelOptions::max_verify_tokens); every
  // token counts as accepted (the lane advances by the slice).
  py::array_t<int32_t> forward_batch_sampled(const Slices& items, const py::list& rows, bool verify) {
    if (!model_->samples_on_device()) throw py::value_error("this model's backend does not sample on its device");
    const SamplingBatch sampling = sampling_batch_from(rows);
    std::vector<int32_t> tokens;
    BatchPlan plan = make_plan(items, verify, tokens);
    for (auto& slice : plan.slices) slice.keep_states = verify;
    const auto wanted = static_cast<size_t>(plan.num_logit_rows());
    if (sampling.rows.size() != wanted)
      throw py::value_error(verify ? "one sampling row per token of a verified slice" : "one sampling row per slice");
    py::array_t<int32_t> ids(static_cast<py::ssize_t>(wanted));
    int32_t* out = ids.mutable_data();
    {
      py::gil_scoped_release release;
      model_->forward_sampled(plan, sampling, out);
    }
    advance(items);
    return ids;
  }

  py::array_t<float> forward(int lane, int start_pos, const std::vector<int32_t>& tokens, bool all_logits) {
    py::array_t<float> rows = forward_batch({{lane, start_pos, tokens}}, all_logits);
    if (all_logits) return rows;
    return rows.attr("reshape")(py::make_tuple(info().vocab_size)).cast<py::array_t<float>>();
  }

  // One MTP draft step (hybrid models, spec §4): slot i pairs hidden_prev[i] (the main model's
  // final-normed hidden at position start_pos + i) with tokens[i]; uses the lane's pages (the
  // MTP head's own KV layer). Returns (logits [n, proposal vocab], hidden after mtp.norm [n, hidden]).
  std::tuple<py::array_t<float>, py::array_t<float>> forward_mtp(
      int lane, int start_pos, const std::vector<int32_t>& tokens,
      const py::array_t<float, py::array::c_style | py::array::forcecast>& hidden_prev, int step) {
    auto* head = dynamic_cast<MtpHead*>(model_.get());
    if (!head) throw py::value_error("this model has no MTP head");
    Lane& state = lane_at(lane);
    const auto n = static_cast<py::ssize_t>(tokens.size());
    const auto h = static_cast<py::ssize_t>(info().hidden_size);
    if (n == 0 || start_pos < 0) throw py::value_error("forward_mtp needs tokens and a non-negative start_pos");
    if (hidden_prev.ndim() != 2 || hidden_prev.shape(0) != n || hidden_prev.shape(1) != h)
      throw py::value_error("hidden_prev must be [len(tokens), hidden_size]");
    const int64_t end = static_cast<int64_t>(start_pos) + n;
    if (end > max_context_) throw py::value_error("forward_mtp would exceed max_context");
    ensure_pages(state, end);
    BatchPlan plan;
    SeqSlice slice;
    slice.lane = lane;
    slice.start_pos = start_pos;
    slice.num_tokens = static_cast<int32_t>(n);
    slice.page_table = state.pages.data();
    slice.num_pages = static_cast<int32_t>(state.pages.size());
    slice.all_logits = true;
    plan.slices.push_back(slice);
    plan.tokens = tokens;
    py::array_t<float> logits({n, static_cast<py::ssize_t>(head->proposal_vocab())});
    py::array_t<float> hidden({n, h});
    float* logits_out = logits.mutable_data();
    float* hidden_out = hidden.mutable_data();
    const float* hidden_in = hidden_prev.data();
    {
      py::gil_scoped_release release;
      head->forward_mtp(plan, hidden_in, step, logits_out, hidden_out);
    }
    return {logits, hidden};
  }

  // The engine's MTP pass over a batch: slices (lane, start_pos, tokens) with hidden_prev
  // [total tokens, hidden] (host), outputs for each slice's last row only: (logits [slices,
  // proposal vocab], hidden after mtp.norm [slices, hidden]).
  std::tuple<py::array_t<float>, py::array_t<float>> forward_mtp_batch(
      const Slices& items, const py::array_t<float, py::array::c_style | py::array::forcecast>& hidden_prev,
      int step) {
    auto* head = dynamic_cast<MtpHead*>(model_.get());
    if (!head) throw py::value_error("this model has no MTP head");
    std::vector<int32_t> tokens;
    const BatchPlan plan = make_plan(items, false, tokens);
    const auto h = static_cast<py::ssize_t>(info().hidden_size);
    const auto t = static_cast<py::ssize_t>(tokens.size());
    if (hidden_prev.ndim() != 2 || hidden_prev.shape(0) != t || hidden_prev.shape(1) != h)
      throw py::value_error("hidden_prev must be [total tokens, hidden_size]");
    std::vector<int32_t> last_rows;
    int32_t row = 0;
    for (const auto& s : plan.slices) last_rows.push_back((row += s.num_tokens) - 1);
    const auto n = static_cast<py::ssize_t>(last_rows.size());
    py::array_t<float> logits({n, static_cast<py::ssize_t>(head->proposal_vocab())});
    py::array_t<float> hidden({n, h});
    float* logits_out = logits.mutable_data();
    float* hidden_out = hidden.mutable_data();
    const float* hidden_in = hidden_prev.data();
    {
      py::gil_scoped_release release;
      head->forward_mtp_rows(plan, hidden_in, step, last_rows, logits_out, hidden_out);
    }
    return {logits, hidden};
  }

  void set_proposal_vocab(int64_t tokens) {
    auto* head = dynamic_cast<MtpHead*>(model_.get());
    if (!head) throw py::value_error("this model has no MTP head");
    head->set_proposal_vocab(tokens);
  }

  void set_proposal_extra_ids(std::vector<int32_t> ids) {
    auto* head = dynamic_cast<MtpHead*>(model_.get());
    if (!head) throw py::value_error("this model has no MTP head");
    head->set_proposal_extra_ids(std::move(ids));
  }

  // The token id of every column of the MTP logits (the prefix ids, then the extra ids).
  std::vector<int32_t> proposal_ids() const {
    auto* head = dynamic_cast<MtpHead*>(model_.get());
    if (!head) throw py::value_error("this model has no MTP head");
    std::vector<int32_t> ids(static_cast<size_t>(head->proposal_vocab()));
    for (size_t c = 0; c < ids.size(); ++c) ids[c] = head->proposal_token(static_cast<int64_t>(c));
    return ids;
  }

  void reset(int lane) {
    Lane& state = lane_at(lane);
    for (const auto& other : lanes_)
      if (&other != &state && other.borrowed_from == lane)
        throw py::value_error("lane " + std::to_string(lane) + " lends pages to another lane; reset that one first");
    kv_->release(std::vector<int32_t>(state.pages.begin() + state.borrowed_pages, state.pages.end()));
    state.pages.clear();
    state.length = 0;
    state.borrowed_pages = 0;
    state.borrowed_from = -1;
    model_->reset_lane(lane);
  }

  // Benchmarks of long contexts without their prefill: lane `lane` is reset and continues as
  // if it held `length` tokens, over pages taken now whose K/V are whatever the pool holds
  // (zeros in a fresh pool) and, for a model with recurrent state, the state of an empty lane
  // (through snapshot slot 0, so the runner needs snapshot_slots >= 1 there). Attention then
  // reads as many bytes as after a real prefill; the tokens it produces mean nothing.
  void assume_context(int lane, int64_t length) {
    if (length <= 0 || length > max_context_) throw py::value_error("assume_context: length outside (0, max_context]");
    reset(lane);
    Lane& state = lane_at(lane);
    ensure_pages(state, length);
    if (model_->has_recurrent_state()) {
      if (model_->snapshot_slots() < 1) throw py::value_error("assume_context needs snapshot_slots >= 1 for this model");
      model_->save_snapshot(lane, 0);
      model_->resume_lane(lane, static_cast<int32_t>(length), 0);
    }
    state.length = length;
  }

  // Makes empty lane `dst` start with the first `length` cached tokens of lane `src` by
  // pointing at the same pages (no copy). `length` must be a whole number of pages, so later
  // writes of `dst` go to pages of its own. For benchmarks of many long sequences.
  void share_prefix(int src, int dst, int64_t length) {
    Lane& from = lane_at(src);
    Lane& to = lane_at(dst);
    if (src == dst || to.length != 0 || !to.pages.empty())
      throw py::value_error("share_prefix needs two different lanes, the destination empty");
    if (length <= 0 || length % kPageTokens != 0 || length > from.length)
      throw py::value_error("share_prefix: length must be a positive multiple of " + std::to_string(kPageTokens) +
                            " not above the source's " + std::to_string(from.length) + " tokens");
    const int64_t pages = length / kPageTokens;
    if (model_->has_recurrent_state()) {
      // A hybrid lane continues from a recurrent state: the source's, through snapshot slot 0
      // (which needs snapshot_slots >= 1 and the whole of the source's length).
      if (length != from.length || model_->snapshot_slots() < 1)
        throw py::value_error("share_prefix on a hybrid model needs snapshot_slots >= 1 and the source's whole length");
      model_->save_snapshot(src, 0);
      model_->resume_lane(dst, static_cast<int32_t>(length), 0);
    }
    to.pages.assign(from.pages.begin(), from.pages.begin() + pages);
    to.borrowed_pages = pages;
    to.borrowed_from = src;
    to.length = length;
  }

 private:
  // A plan over the slices (tokens gathered into `tokens`, which the plan views); grows pages.
  BatchPlan make_plan(const Slices& items, bool all_logits, std::vector<int32_t>& tokens) {
    BatchPlan plan;
    for (const auto& [lane, start_pos, ids] : items) {
      Lane& state = lane_at(lane);
      if (ids.empty()) throw py::value_error("a slice needs at least one token");
      if (start_pos < 0 || start_pos > state.length)
        throw py::value_error("lane " + std::to_string(lane) + " holds " + std::to_string(state.length) +
                              " tokens; start_pos " + std::to_string(start_pos) + " would leave a gap");
      const int64_t end = static_cast<int64_t>(start_pos) + static_cast<int64_t>(ids.size());
      if (end > max_context_)
        throw py::value_error("lane " + std::to_string(lane) + " would exceed max_context " +
                              std::to_string(max_context_));
      ensure_pages(state, end);
      SeqSlice slice;
      slice.lane = lane;
      slice.start_pos = start_pos;
      slice.num_tokens = static_cast<int32_t>(ids.size());
      slice.page_table = state.pages.data();
      slice.num_pages = static_cast<int32_t>(state.pages.size());
      slice.wants_logits = true;
      slice.all_logits = all_logits;
      plan.slices.push_back(slice);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
    }
    plan.tokens = tokens;
    return plan;
  }

  void advance(const Slices& items) {
    for (const auto& [lane, start_pos, ids] : items)
      lanes_[static_cast<size_t>(lane)].length = start_pos + static_cast<int64_t>(ids.size());
  }

  struct Lane {
    std::vector<int32_t> pages;
    int64_t length = 0;
    int64_t borrowed_pages = 0;  // leading pages owned by lane `borrowed_from` (share_prefix)
    int borrowed_from = -1;
  };

  // Grows the lane's page table to cover positions [0, end).
  void ensure_pages(Lane& state, int64_t end) {
    const int64_t needed = (end + kPageTokens - 1) / kPageTokens - static_cast<int64_t>(state.pages.size());
    if (needed <= 0) return;
    auto pages = kv_->allocate(needed);
    if (!pages) throw std::runtime_error("KV pool exhausted");
    state.pages.insert(state.pages.end(), pages->begin(), pages->end());
  }

  Lane& lane_at(int lane) {
    if (lane < 0 || lane >= static_cast<int>(lanes_.size()))
      throw py::index_error("lane " + std::to_string(lane) + " is outside [0, " + std::to_string(lanes_.size()) + ")");
    return lanes_[static_cast<size_t>(lane)];
  }

  std::unique_ptr<Artifact> artifact_;
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<Model> model_;
  std::vector<Lane> lanes_;
  int64_t max_context_;
};

py::dict info_dict(const ModelInfo& i) {
  py::dict d;
  d["architecture"] = i.architecture;
  d["vocab_size"] = i.vocab_size;
  d["hidden_size"] = i.hidden_size;
  d["num_layers"] = i.num_layers;
  d["num_kv_layers"] = i.num_kv_layers;
  d["num_kv_heads"] = i.num_kv_heads;
  d["head_dim"] = i.head_dim;
  d["max_position_embeddings"] = i.max_position_embeddings;
  d["num_params"] = i.num_params;
  d["weight_bytes"] = i.weight_bytes;
  d["weight_format"] = i.weight_format;
  return d;
}

}  // namespace

void bind_model_runner(py::module_& m) {
  py::class_<ModelRunner>(m, "ModelRunner")
      .def(py::init<const std::string&, int, int, int, int, const std::string&, int64_t, const std::string&,
                    int64_t, int, const std::string&, int>(),
           py::arg("artifact_path"), py::arg("max_lanes") = 1, py::arg("max_batch_tokens") = 512,
           py::arg("threads") = 0, py::arg("max_context") = 2048, py::arg("device") = "cpu",
           py::arg("random_weights_seed") = -1, py::arg("random_weights_dtype") = "bf16",
           py::arg("proposal_vocab") = 0, py::arg("max_verify_tokens") = 0, py::arg("kv_dtype") = "bf16",
           py::arg("snapshot_slots") = 0)
      .def_property_readonly("info", [](const ModelRunner& r) { return info_dict(r.info()); })
      .def("forward", &ModelRunner::forward, py::arg("lane"), py::arg("start_pos"), py::arg("tokens"),
           py::arg("all_logits") = false,
           "Runs tokens of one lane from start_pos; returns the last token's logits [vocab] "
           "(or [len(tokens), vocab] with all_logits).")
      .def("forward_batch", &ModelRunner::forward_batch, py::arg("slices"), py::arg("all_logits") = false,
           "slices: [(lane, start_pos, tokens)] in one plan; returns logits rows in slice order.")
      .def("forward_batch_sampled", &ModelRunner::forward_batch_sampled, py::arg("slices"), py::arg("rows"),
           py::arg("verify") = false,
           "As forward_batch, but each slice's next token is sampled on the device with its row of `rows` "
           "(dicts as for sample_rows_host); returns the ids (-1: NaN, -2: nothing selectable).")
      .def("forward_mtp", &ModelRunner::forward_mtp, py::arg("lane"), py::arg("start_pos"), py::arg("tokens"),
           py::arg("hidden_prev"), py::arg("step") = 0,
           "One MTP head step (hybrid models): returns (logits [n, vocab], hidden after mtp.norm [n, hidden]).")
      .def("forward_mtp_batch", &ModelRunner::forward_mtp_batch, py::arg("slices"), py::arg("hidden_prev"),
           py::arg("step") = 0,
           "The engine's MTP pass over several lanes: (logits [slices, proposal vocab], hidden [slices, hidden]) "
           "for each slice's last row.")
      .def("set_proposal_vocab", &ModelRunner::set_proposal_vocab, py::arg("tokens"),
           "The MTP head scores token ids below `tokens` only (--lm-head-draft); 0 = the full lm_head.")
      .def("set_proposal_extra_ids", &ModelRunner::set_proposal_extra_ids, py::arg("ids"),
           "Ids the proposal head scores beside its prefix (their columns follow it, ascending).")
      .def_property_readonly("proposal_ids", &ModelRunner::proposal_ids,
                             "The token id of each column of the MTP head's logits.")
      .def("reset", &ModelRunner::reset, py::arg("lane"))
      .def("share_prefix", &ModelRunner::share_prefix, py::arg("src"), py::arg("dst"), py::arg("length"),
           "Lane dst starts with src's first `length` tokens (a multiple of 64) on shared pages.")
      .def("assume_context", &ModelRunner::assume_context, py::arg("lane"), py::arg("length"),
           "Benchmarks: the lane continues as if it held `length` tokens (pages taken, K/V and state not computed).")
      .def_property_readonly("kv_page_bytes", [](const ModelRunner& r) { return r.kv_page_bytes(); });
}

}  // namespace ninfer::bindings
