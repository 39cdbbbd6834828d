// Qwen3.5/3.6 hybrid decoders (architectures qwen3_5 and qwen3_5_moe; model spec §2-§4):
// Gated DeltaNet and gated full-attention layers as `layer_types` says, dense SwiGLU or sparse
// MoE MLPs, and the one-layer MTP draft head, written once against the Backend op set.
//
// Per-lane state: the full-attention layers keep K/V in the lane's pages (KV layers 0..F-1,
// F = full-attention layers; the MTP layers follow), the GDN layers a conv and a recurrent state
// in the lane's state slot, which the backend holds. A slot cannot be rewound: each slice must
// start where the lane's previous slice ended, and reset_lane makes the lane empty again.
#pragma once

#include <memory>
#include <span>

#include "models/model.h"

namespace ninfer {

// The MTP head of a hybrid model (spec §4): the draft model of speculative decoding.
class MtpHead {
 public:
  virtual ~MtpHead() = default;
  virtual int64_t mtp_layers() const = 0;
  // One MTP step over the plan's slices. Slot i of a slice pairs hidden_prev[i] (host, the main
  // model's final-normed hidden state at position start_pos + i) with the embedding of the
  // plan's token i (the token after it), attends with MTP layer `step % mtp_layers` over the
  // slice's pages (its own KV layer), and writes logits [tokens, vocab] for every token and,
  // when hidden_out is not null, the hidden after mtp.norm [tokens, hidden] (host memory).
  virtual void forward_mtp(const BatchPlan& plan, const float* hidden_prev, int step, float* logits,
                           float* hidden_out) = 0;
  // forward_mtp with outputs for the given rows of the plan only (host memory): logits
  // [rows, vocab] and the normed hidden [rows, hidden]. Drafting reads one row per lane.
  virtual void forward_mtp_rows(const BatchPlan& plan, const float* hidden_prev, int step,
                                std::span<const int32_t> rows, float* logits, float* hidden_out) = 0;
  // Columns of the logits the two calls above write: the vocabulary, or with --lm-head-draft
  // (ModelOptions::proposal_vocab) the proposal head's ids 0..proposal_vocab()-1. Drafts are
  // argmaxes over these columns, so a column index is the token id.
  virtual int64_t proposal_vocab() const = 0;
  // Sets it: 0 or the vocabulary size or more = the full lm_head (std::invalid_argument for a
  // head that cannot be cut). Benchmarks switch it; the engine sets it once at load.
  virtual void set_proposal_vocab(int64_t tokens) = 0;
  // Token ids the proposal head scores beside its lowest ids (the special and control tokens
  // generation emits: EOS, thinking and tool markers), from their own lm_head rows. They are
  // the columns after the prefix, in ascending id order; ids inside the prefix, duplicates
  // ids outside the vocabulary and ids without a proposal head add nothing.
  virtual void set_proposal_extra_ids(std::vector<int32_t> ids) = 0;
  // The token id of a column of the logits above (the column itself inside the prefix).
  virtual int32_t proposal_token(int64_t column) const = 0;
};

std::unique_ptr<Model> make_qwen3_5_model(const Artifact& artifact, KvPool& kv, const ModelOptions& options);

}  // namespace ninfer
