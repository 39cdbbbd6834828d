// The engine's state for one request, from submit to its finished event.
//
// Owned by the engine (shared with the scheduler's queues); only the worker thread mutates it
// once it is admitted, except for `cancel_requested`, which any thread may set.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/engine_event.h"
#include "engine/constraint_matcher.h"
#include "cache/prefix_cache.h"
#include "engine/generation_params.h"
#include "engine/ngram_drafter.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "engine/thinking_budget.h"

namespace ninfer {

using EngineClock = std::chrono::steady_clock;

enum class Phase : uint8_t { Pending, Prefilling, Decoding, Finished };

struct Sequence {
  Sequence(uint64_t id_, GenerationParams params_, int32_t output_cap_, uint64_t seed, int64_t vocab_size)
      : id(id_),
        params(std::move(params_)),
        output_cap(output_cap_),
        history(params.prompt),
        sampler(params.sampling, seed),
        stops(params.stop_strings),
        thinking(params.thinking) {
    if (params.constraint) {
      constraint.emplace(params.constraint->grammar, vocab_size, params.constraint->start_after,
                         params.constraint->prefix);
      constraint->stats().cache = params.constraint->cache;
      constraint->stats().prepare_seconds = params.constraint->prepare_seconds;
    }
  }

  // Whether this step's draw is under a grammar mask.
  bool constrained_now() const { return constraint && constraint->active(); }

  int32_t prompt_len() const { return static_cast<int32_t>(params.prompt.size()); }
  // Tokens to forward before the next sampled one: the prompt, or after a pause (replay) the
  // prompt and every committed output token but the last, which the next decode step feeds.
  int32_t prefill_target() const {
    return prompt_len() + std::max<int32_t>(static_cast<int32_t>(output.size()) - 1, 0);
  }
  int32_t prefill_left() const { return prefill_target() - cached; }
  bool replaying() const { return !output.empty(); }

  const uint64_t id;
  const GenerationParams params;
  const int32_t output_cap;  // min(max_tokens, max_context - prompt): output ends at this length

  Phase phase = Phase::Pending;
  int lane = -1;
  int32_t cached = 0;            // tokens whose K/V are in `pages` (= position of the next input)
  std::vector<int32_t> pages;    // KV page ids in position order
  std::vector<int32_t> output;   // generated tokens
  std::vector<int32_t> history;  // prompt then output: the token at every position
  TokenCounts output_counts;     // histogram of `output`, for penalties
  Sampler sampler;
  StopMatcher stops;
  ThinkingBudget thinking;
  std::optional<ConstraintMatcher> constraint;  // from params.constraint

  // Prefix cache.
  int32_t cached_tokens = 0;       // prompt tokens reused at first admission (reported)
  bool ever_admitted = false;
  BlockChain chain;                // the leading blocks of `pages` published to the cache
  std::vector<int32_t> taps;       // planned prefill snapshot positions, ascending
  uint64_t endpoint_key = 0;       // block of this request's latest decode snapshot (0: none)
  int32_t pauses = 0;
  int64_t replayed_tokens = 0;            // tokens recomputed by replays after pauses
  int64_t prefilled_tokens = 0;           // prompt tokens computed by initial prefill
  int32_t computed_high = 0;              // the frontier reached before the latest pause
  bool replay_pending = false;            // restored, rebuilding up to computed_high
  bool recovering = false;                // replayed, waiting for its first fresh unit
  double paused_ms = 0;                   // time spent paused, over completed pauses
  EngineClock::time_point paused_at{};    // the latest pause

  EngineClock::time_point submitted{};
  std::optional<EngineClock::time_point> deadline;  // pending only
  EngineClock::time_point admitted{};
  EngineClock::time_point prefilled{};
  EngineClock::time_point last_commit{};
  // This request's part of its decode rounds' time: a round's duration is split evenly over
  // the tokens it computed, so concurrent requests' shares add up to the wall time.
  double decode_share_ms = 0;

  // Speculative decoding (engine_speculation.cpp). A decode row verifies `drafts` after
  // output.back(); the round commits the accepted prefix plus one sampled token.
  std::vector<int32_t> drafts;       // this round's proposals (empty: a plain decode row)
  bool drafts_from_ngram = false;
  std::vector<int32_t> mtp_drafts;   // the MTP head's proposals for the next round
  bool mtp_failed = false;           // the head failed for this request: no more MTP drafts
  std::unique_ptr<NgramDrafter> ngram;
  // Uniform draws peeked by a round and not yet used: token n always uses draw n, so a seeded
  // request samples the same tokens whatever was drafted.
  std::deque<double> draws;
  int32_t round_committed = 0;  // tokens the last step committed for this request
  int32_t draft_n = 0;           // proposals verified / accepted over the request
  int32_t draft_n_accepted = 0;
  SpeculativeTally spec_tally;

  std::atomic<bool> cancel_requested{false};
};

}  // namespace ninfer
