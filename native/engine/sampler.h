// Token selection on float logits: penalties, temperature, top-k, top-p, min-p, seeded draws.
//
// Filters apply in the order top_k -> top_p -> min_p, each on the temperature-scaled
// distribution: top_p keeps the smallest most-probable prefix of the top_k set whose mass
// reaches top_p of that set's mass; min_p keeps tokens with p >= min_p * p_max. Ties are broken
// by lower token id so that a seed always reproduces the same choice.
//
// The draw u in [0, 1) picks the first kept token whose cumulative weight exceeds u times the
// kept mass, scanning most probable first when top_p < 1 and in id order otherwise: an order
// fixed by the definition alone, so that a device sampler (common/row_sampling.h) given the
// same u picks the same token.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/row_sampling.h"
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
  // The same choice with the draw given (sampling on the device draws it here first).
  int32_t sample_with_draw(std::span<float> logits, const TokenCounts& generated,
                           std::span<const int32_t> suppressed, double u);
  // The next draw of this sampler's generator (what sample would use; greedy draws none).
  double next_draw() { return uniform01(); }
  const SamplingParams& params() const { return params_; }

  // Draws fresh entropy for requests without a seed.
  static uint64_t random_seed();

 private:
  friend int32_t sample_row_on_host(std::span<float> logits, const SamplingBatch& batch, size_t row);
  struct Candidate {
    float weight;  // exp((logit - max) / temperature), so the best token weighs 1 (briefly the
                   // raw logit while top_k selects)
    int32_t id;
  };
  // The chosen id, or kSampledNaN / kSampledNothing; draws from the generator when `u` is
  // negative.
  int32_t choose(std::span<float> logits, const TokenCounts& generated, std::span<const int32_t> suppressed,
                 double u);
  void apply_penalties(std::span<float> logits, const TokenCounts& generated) const;
  void keep_top_k();
  void keep_top_p();
  void keep_min_p();
  double uniform01();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
};

// The message of the error a sampled code stands for (the Sampler throws the same one).
std::string sampled_code_error(int32_t code);

// What a device sampler must return for `row` of `batch` (codes instead of throwing): the
// Sampler's choice with the row's draw, on the host. `logits` is scratch.
int32_t sample_row_on_host(std::span<float> logits, const SamplingBatch& batch, size_t row);

}  // namespace ninfer
