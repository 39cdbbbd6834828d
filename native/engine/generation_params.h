// What one generation request asks of the engine: prompt, output budget, sampling and stops.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/thinking_budget.h"

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

struct GenerationParams {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;  // >= 0; 0 = prompt processing only
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // in addition to the engine's eos ids
  std::vector<std::string> stop_strings;  // matched on bytes across token boundaries
  bool ignore_eos = false;
  int32_t min_tokens = 0;  // eos, stop ids and stop strings are inert until this many tokens
  ThinkingBudgetParams thinking;  // an optional thinking-token cap (thinking_budget.h)
  // Tests of speculative rounds: with speculation on, each round proposes the next tokens of
  // this known continuation (output position i proposes draft_oracle[i]) instead of drafting.
  std::vector<int32_t> draft_oracle;
};

}  // namespace ninfer
