// Lanes, the FIFO pending queue, and the shape of each step.
//
// Lanes are fixed at start. A step is one BatchPlan: every decoding lane contributes its last
// sampled token (followed by its speculative proposals, if any), then prefilling lanes (oldest first) share a budget of `prefill_chunk` prompt
// tokens. A request starts decoding on the step after its prefill completes; a finished
// request leaves its lane at the boundary where the engine releases it, so the next plan has
// no empty row. KV pages are taken from the pool as a sequence grows and returned on release.
//
// Not thread-safe: the engine serialises every call.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "cache/kv_pool.h"
#include "engine/sequence.h"
#include "models/model.h"

namespace ninfer {

struct StepPlan {
  BatchPlan batch;
  std::vector<int32_t> tokens;    // storage behind batch.tokens
  std::vector<Sequence*> rows;    // the sequence of each slice, in slice order
  int32_t decode_rows = 0;
  int32_t prefill_tokens = 0;
  bool empty() const { return rows.empty(); }
};

class Scheduler {
 public:
  Scheduler(int num_lanes, int32_t prefill_chunk, KvPool& pool);

  int num_lanes() const { return static_cast<int>(lanes_.size()); }
  int running() const { return running_; }
  int pending() const { return static_cast<int>(pending_.size()); }
  bool idle() const { return running_ == 0 && pending_.empty(); }

  void enqueue(std::shared_ptr<Sequence> seq);
  // Removes a pending request; null when it is not pending.
  std::shared_ptr<Sequence> remove_pending(uint64_t id);
  // Removes and returns pending requests whose deadline is at or before `now`.
  std::vector<std::shared_ptr<Sequence>> take_expired(EngineClock::time_point now);
  std::vector<std::shared_ptr<Sequence>> take_all_pending();

  // Moves pending requests into free lanes in FIFO order; returns them.
  std::vector<Sequence*> admit(EngineClock::time_point now);
  // The resident sequences in admission order.
  std::vector<Sequence*> resident() const;

  // Fills `step` for the next traversal (empty when no lane has work). Allocates the pages
  // the step writes into; throws std::runtime_error if the pool runs dry.
  void plan(StepPlan& step);
  // Pages covering the sequence's first `tokens` positions (the MTP head drafts ahead of the
  // next plan); throws std::runtime_error if the pool runs dry.
  void reserve(Sequence& seq, int32_t tokens);
  // Frees the lane and returns the sequence's pages.
  void release(Sequence& seq);

 private:
  void ensure_pages(Sequence& seq, int32_t tokens);

  int32_t prefill_chunk_;
  KvPool& pool_;
  std::vector<std::shared_ptr<Sequence>> lanes_;
  std::deque<std::shared_ptr<Sequence>> pending_;
  int running_ = 0;
};

}  // namespace ninfer
