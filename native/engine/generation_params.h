// What one generation request asks of the engine: prompt, output budget, sampling and stops.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/thinking_budget.h"
#include "engine/grammar_compiler.h"

namespace ninfer {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy argmax
  float top_p = 1.0f;        // (0, 1]; 1 = disabled
  int32_t top_k = 0;         // 0 = disabled
  float min_p = 0.0f;        // [0, 1]; keeps tokens with p >= min_p * p_max
  float presence_penalty = 0.0f;   // subtracted once from every generated token's logit
  float frequency_penalty = 0.0f;  // subtracted per occurrence of a generated token
  std::optional<uint64_t> seed;    // none = fresh entropy
};

// An output constraint compiled before submit (GrammarCompiler::compile).
struct ConstraintRequest {
  std::shared_ptr<const CompiledConstraint> grammar;
  int32_t start_after = -1;  // >= 0: unconstrained until this token is generated (</think>)
  CacheResult cache = CacheResult::Built;
  double prepare_seconds = 0.0;  // the compile or cache wait that preceded submit
  std::string prefix;  // answer text already given (an assistant prefill): the grammar
                       // consumes it before the first generated token
};

struct GenerationParams {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;  // >= 0; 0 = prompt processing only
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // in addition to the engine's eos ids
  std::vector<std::string> stop_strings;  // matched on bytes across token boundaries
  bool ignore_eos = false;
  int32_t min_tokens = 0;  // eos, stop ids and stop strings are inert until this many tokens
  // Tests: each event carries the float logits its tokens were sampled from (host sampling
  // only; a device-sampled step has none to give).
  bool capture_logits = false;
  // Prompt positions a later request is likely to share up to (client cache hints, the end of
  // the latest message): on a model with recurrent state, state snapshots are planned at the
  // block boundary at or before each. Out-of-range values are ignored.
  std::vector<int32_t> cache_candidates;
  ThinkingBudgetParams thinking;  // an optional thinking-token cap (thinking_budget.h)
  // Tests of speculative rounds: with speculation on, each round proposes the next tokens of
  // this known continuation (output position i proposes draft_oracle[i]) instead of drafting.
  std::vector<int32_t> draft_oracle;
  std::optional<ConstraintRequest> constraint;  // tokens outside the grammar are never sampled
  bool report_progress = false;  // a PromptProgress event after each prefill chunk that leaves more prompt
};

}  // namespace ninfer
