// The engine's state for one request, from submit to its finished event.
//
// Owned by the engine (shared with the scheduler's queues); only the worker thread mutates it
// once it is admitted, except for `cancel_requested`, which any thread may set.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/engine_event.h"
#include "engine/generation_params.h"
#include "engine/ngram_drafter.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "engine/thinking_budget.h"

namespace ninfer {

using EngineClock = std::chrono::steady_clock;

enum class Phase : uint8_t { Pending, Prefilling, Decoding, Finished };

struct Sequence {
  Sequence(uint64_t id_, GenerationParams params_, int32_t output_cap_, uint64_t seed)
      : id(id_),
        params(std::move(params_)),
        output_cap(output_cap_),
        sampler(params.sampling, seed),
        stops(params.stop_strings),
        thinking(params.thinking) {}

  int32_t prompt_len() const { return static_cast<int32_t>(params.prompt.size()); }
  int32_t prompt_left() const { return prompt_len() - cached; }

  const uint64_t id;
  const GenerationParams params;
  const int32_t output_cap;  // min(max_tokens, max_context - prompt): output ends at this length

  Phase phase = Phase::Pending;
  int lane = -1;
  int32_t cached = 0;            // tokens whose K/V are in `pages` (= position of the next input)
  std::vector<int32_t> pages;    // KV page ids in position order
  std::vector<int32_t> output;   // generated tokens
  TokenCounts output_counts;     // histogram of `output`, for penalties
  Sampler sampler;
  StopMatcher stops;
  ThinkingBudget thinking;

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
