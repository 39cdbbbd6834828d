// Lanes, the FIFO pending queue, the paused queue, and the shape of each step.
//
// Lanes are fixed at start. A step is one BatchPlan: every decoding lane contributes its last
// sampled token, then prefilling lanes (oldest first) share a budget of `prefill_chunk` prompt
// tokens; a prefill slice also ends at the sequence's next planned snapshot tap. A request
// starts decoding on the step after its prefill completes; a finished request leaves its lane
// at the boundary where the engine releases it, so the next plan has no empty row. A decoding
// lane with speculative proposals feeds them after its token (one verified slice); their
// extra pages come only from free pages, never by evicting or pausing: without room the lane
// decodes one token that step.
//
// Memory: the KV pool is shared and smaller than lanes x max_context in general. Before a
// step, each resident sequence (oldest first) reserves the pages its unit needs; when the pool
// is short the prefix cache evicts unreferenced blocks, and when that is not enough the
// youngest resident is paused (its pages released, its full blocks left in the cache) so the
// oldest always progresses. A paused request is re-admitted in original order once it fits
// and replays its prompt and committed output from the deepest cached prefix (no sampling).
// Fresh requests that fit are admitted even while a paused one waits.
//
// Not thread-safe: the engine serialises every call.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "cache/kv_pool.h"
#include "cache/prefix_cache.h"
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
  // `cache` (may be null: no prefix reuse) must outlive the scheduler.
  Scheduler(int num_lanes, int32_t prefill_chunk, KvPool& pool, PrefixCache* cache);

  int num_lanes() const { return static_cast<int>(lanes_.size()); }
  int running() const { return running_; }
  int pending() const { return static_cast<int>(pending_.size()); }
  int paused() const { return static_cast<int>(paused_.size()); }
  bool idle() const { return running_ == 0 && pending_.empty() && paused_.empty(); }
  uint64_t pauses() const { return pauses_; }
  // Pages a request could use now: free ones and cached blocks no sequence maps.
  int64_t available_pages() const;

  void enqueue(std::shared_ptr<Sequence> seq);
  // Removes a pending request; null when it is not pending.
  std::shared_ptr<Sequence> remove_pending(uint64_t id);
  // Removes and returns pending requests whose deadline is at or before `now`.
  std::vector<std::shared_ptr<Sequence>> take_expired(EngineClock::time_point now);
  std::vector<std::shared_ptr<Sequence>> take_all_pending();
  // The requests paused since the last call (still owned by the paused queue).
  std::vector<Sequence*> take_paused_now() { return std::exchange(paused_now_, {}); }

  // Moves paused (first, in original order) and pending requests that fit the pool into free
  // lanes; returns them. The caller then restores each one's cached prefix (Engine).
  std::vector<Sequence*> admit(EngineClock::time_point now);
  // The resident sequences in admission order.
  std::vector<Sequence*> resident() const;

  // Fills `step` for the next traversal (empty when no lane has work), reserving the pages
  // the step writes into (evicting cached blocks, then pausing younger requests). Throws
  // std::runtime_error if even the oldest request alone cannot grow.
  void plan(StepPlan& step);
  // Pages covering the sequence's first `tokens` positions from free pages only (the MTP head
  // drafts ahead of the next plan); false, taking nothing, when the pool has too few free.
  bool reserve_free(Sequence& seq, int32_t tokens);
  // Returns the sequence's pages past its first `tokens` positions (a rejected proposal's
  // positions). Pages of published blocks are never past the committed length.
  void truncate(Sequence& seq, int32_t tokens);
  // Frees the lane and returns the sequence's pages.
  void release(Sequence& seq);

 private:
  // Pages for [0, tokens) of `seq`; false when the pool is short even after eviction.
  bool reserve_pages(Sequence& seq, int32_t tokens);
  // Tokens the sequence's next unit needs pages for, from a fresh admission or a restore.
  bool fits(const Sequence& seq) const;
  void pause(Sequence& seq);
  void drop_pages(Sequence& seq);

  int32_t prefill_chunk_;
  KvPool& pool_;
  PrefixCache* cache_;
  std::vector<std::shared_ptr<Sequence>> lanes_;
  std::deque<std::shared_ptr<Sequence>> pending_;
  std::deque<std::shared_ptr<Sequence>> paused_;  // ascending id (original order)
  int running_ = 0;
  uint64_t pauses_ = 0;
  std::vector<Sequence*> paused_now_;
};

}  // namespace ninfer
