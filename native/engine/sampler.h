// Token selection on float logits: penalties, temperature, top-k, top-p, min-p, seeded draws.
//
// Filters apply in the order top_k -> top_p -> min_p, each on the temperature-scaled
// distribution: top_p keeps the smallest most-probable prefix of the top_k set whose mass
// reaches top_p of that set's mass; min_p keeps tokens with p >= min_p * p_max. Ties are broken
// by lower token id so that a seed always reproduces the same choice.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/generation_params.h"

namespace ninfer {

// How many times each token was generated so far (penalties read this).
using TokenCounts = std::unordered_map<int32_t, int32_t>;

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed);

  // Picks the next token. `logits` is scratch: penalties and masks are applied in place.
  // `suppressed` ids are never chosen. Throws std::runtime_error when the logits hold a NaN or
  // no token is selectable.
  int32_t sample(std::span<float> logits, const TokenCounts& generated,
                 std::span<const int32_t> suppressed);

  // Draws fresh entropy for requests without a seed.
  static uint64_t random_seed();

 private:
  struct Candidate {
    float weight;  // exp((logit - max) / temperature), so the best token weighs 1 (briefly the
                   // raw logit while top_k selects)
    int32_t id;
  };
  void apply_penalties(std::span<float> logits, const TokenCounts& generated) const;
  void keep_top_k();
  void keep_top_p();
  void keep_min_p();
  double uniform01();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
};

}  // namespace ninfer
