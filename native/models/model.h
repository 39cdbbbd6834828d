// The contract between the engine (scheduler) and a model architecture.
//
// A Model is written once against the Backend op set. The engine hands it one BatchPlan per
// step: a list of sequence slices, each a run of new tokens for one lane starting at a known
// position. The model writes K/V for those tokens into the lane's pages, attends over every
// cached position up to and including each token (causal), and produces logits for the
// rows the plan asks for.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/row_sampling.h"

namespace ninfer {

class Artifact;
class KvPool;
struct TensorParallelRank;

// Shape facts every architecture exposes; the engine sizes pools and samplers from them.
struct ModelInfo {
  std::string architecture;
  int64_t vocab_size = 0;         // rows of the logits
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_kv_layers = 0;       // layers that own KV pages (all, for dense models)
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  int64_t num_params = 0;          // logical weight elements over distinct weight tensors
  int64_t weight_bytes = 0;        // encoded payload bytes of those tensors
  std::string weight_format;       // dominant format by payload bytes: "f32", "bf16", "q8_0", ...
};

// One lane's new tokens in this step.
struct SeqSlice {
  int lane = 0;                    // which resident lane (state slot) the tokens belong to
  int32_t start_pos = 0;           // position of the first new token (= tokens already cached)
  int32_t num_tokens = 0;          // new tokens, stored contiguously in BatchPlan::tokens
  const int32_t* page_table = nullptr;  // KV page ids covering [0, start_pos + num_tokens)
  int32_t num_pages = 0;
  bool wants_logits = false;       // produce logits for the slice's last token
  bool all_logits = false;         // produce logits for every token of the slice, in order
                                   // (speculative verification, tests); implies wants_logits
  // Speculative verification: the model keeps what it needs to roll the lane back to any
  // prefix of this slice (recurrent state per position); the engine then calls keep_prefix.
  bool keep_states = false;
  int32_t logit_rows() const { return all_logits ? num_tokens : (wants_logits ? 1 : 0); }
};

struct BatchPlan {
  std::span<const int32_t> tokens;  // all slices' tokens, slice after slice
  std::vector<SeqSlice> slices;
  // When not null (host memory, [tokens.size(), hidden_size]): the final-normed hidden state of
  // every token, the input of the MTP draft head. Models without one throw.
  float* hidden_out = nullptr;
  // Rows of logits the plan asks for; they are written in slice order.
  // Every slice is one decode token: the step a backend may capture and replay as a graph.
  bool single_token_slices() const {
    for (const auto& s : slices)
      if (s.num_tokens != 1) return false;
    return true;
  }
  int num_logit_rows() const {
    int n = 0;
    for (const auto& s : slices) n += s.logit_rows();
    return n;
  }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  // Runs one traversal of the network over every slice of the plan and writes
  // float32 logits [plan.num_logit_rows(), vocab_size] into `logits` (host memory).
  virtual void forward(const BatchPlan& plan, float* logits) = 0;
  // Whether forward_sampled works (the model's backend samples on its device).
  virtual bool samples_on_device() const { return false; }
  // forward, but only the chosen token of each logit row comes back: ids[r] (host memory) as
  // Backend::sample_rows defines it, for sampling.rows[r], r < plan.num_logit_rows().
  virtual void forward_sampled(const BatchPlan& plan, const SamplingBatch& sampling, int32_t* ids);
  // Clears any per-lane state that is not in KV pages (recurrent state of hybrid models).
  virtual void reset_lane(int lane) {}
  // After a forward whose slice for `lane` had keep_states: the lane keeps only its first
  // `length` positions (start_pos < length <= start_pos + num_tokens), as if the slice had held
  // only the tokens before `length`. K/V past it stay in the pages but are rewritten before
  // anything reads them; recurrent state goes back to the state after position length - 1.
  virtual void keep_prefix(int lane, int32_t length) {
    (void)lane;
    (void)length;
  }

  // --- prefix reuse (engine/prefix cache) -------------------------------------------------
  // Whether a lane has state outside its KV pages (the recurrent state of hybrid models). A
  // prefix hit on such a model needs a state snapshot taken at exactly the hit position:
  // cached KV alone cannot rebuild it.
  virtual bool has_recurrent_state() const { return false; }
  // Snapshot slots the model holds for that state (ModelOptions::snapshot_slots).
  virtual int snapshot_slots() const { return 0; }
  // Copies `lane`'s current state into snapshot `slot` (std::logic_error without state).
  virtual void save_snapshot(int lane, int slot);
  // After reset_lane: the lane continues a sequence whose first `position` tokens already
  // have K/V in its pages (a prefix hit or a replay). A model with recurrent state loads
  // snapshot `slot`, which must hold the state after exactly those tokens.
  virtual void resume_lane(int lane, int32_t position, int slot) {
    (void)lane, (void)position, (void)slot;
  }
  // Prefix cache file: copies one KV page (every layer, in the pool's storage type:
  // KvPool::page_bytes) or one snapshot slot (snapshot_floats() floats) between the model's
  // memory and host memory. std::logic_error where the model cannot.
  virtual void kv_page_io(int32_t page, void* host, bool to_host);
  virtual int64_t snapshot_floats() const { return 0; }
  virtual void snapshot_io(int slot, float* host, bool to_host);

 protected:
  // forward_sampled's precondition: one sampling row per logit row (std::invalid_argument).
  static void check_sampling_rows(const BatchPlan& plan, const SamplingBatch& sampling);
};

struct ModelOptions {
  int max_lanes = 1;               // resident lanes the engine will use (state slots)
  int max_batch_tokens = 512;      // largest BatchPlan::tokens.size() the engine will send
  int threads = 0;                 // CPU worker threads; 0 = all cores
  int max_verify_tokens = 0;       // widest keep_states slice (speculative rounds); 0 = none
  // --lm-head-draft: the MTP head scores only token ids below this (the lowest ids; see
  // docs/engine.md for why those); 0, or the vocabulary size or more, = the full lm_head.
  int64_t proposal_vocab = 0;
  // With proposal_vocab: ids above it the head scores as well (MtpHead::set_proposal_extra_ids).
  std::vector<int32_t> proposal_extra_ids;
  int snapshot_slots = 0;          // recurrent-state snapshot slots (hybrid models; prefix cache)
  std::string device = "cpu";      // "cpu" or "cuda[:N]"
  // When >= 0, no weight is read from the artifact (only its header): every weight is made by
  // the backend as seeded random values and every norm weight is 1. For benchmarks of real
  // shapes without a weight file; the backend must implement Backend::random_weight.
  int64_t random_weights_seed = -1;
  // With random weights: the format of the matrices the fp8/nvfp4 converters would quantize
  // ("bf16", "fp8" or "nvfp4"; models/quantized_names.h), made by
  // Backend::random_quantized_weight.
  std::string random_weights_dtype = "bf16";
  // Tensor parallelism (parallel/tensor_parallel_model.h): ranks the model is split over; with
  // more than one, load_model builds one model per rank behind a single Model.
  int tensor_parallel_size = 1;
  // Set for each of those rank models: which shard it is and its collective (null otherwise).
  const TensorParallelRank* tensor_parallel = nullptr;
};

// Builds the model the artifact's architecture names. Throws std::runtime_error with a clear
// message for an unsupported architecture or a missing/mis-shaped tensor. The KvPool must
// outlive the model.
std::unique_ptr<Model> load_model(const Artifact& artifact, KvPool& kv, const ModelOptions& options);

// KV geometry the model needs; the engine builds the KvPool from it before load_model.
struct KvGeometry {
  int64_t num_kv_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};
KvGeometry kv_geometry(const Artifact& artifact);

}  // namespace ninfer
