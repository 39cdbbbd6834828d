#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/constraint_matcher.h"

namespace ninfer {

namespace {

// Most probable first; equal weights by lower id, so the order never depends on the input order.
struct MoreProbable {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
  }
};

}  // namespace

Sampler::Sampler(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {}

uint64_t Sampler::random_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

double Sampler::uniform01() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::apply_penalties(std::span<float> logits, const TokenCounts& generated) const {
  if (params_.presence_penalty == 0.0f && params_.frequency_penalty == 0.0f) return;
  const auto vocab = static_cast<int64_t>(logits.size());
  for (const auto& [token, count] : generated) {
    if (token < 0 || token >= vocab || count <= 0) continue;
    logits[token] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
  }
}

int32_t Sampler::sample(std::span<float> logits, const TokenCounts& generated,
                        std::span<const int32_t> suppressed) {
  const int32_t id = choose(logits, generated, suppressed, -1.0);
  if (id < 0) throw std::runtime_error(sampled_code_error(id));
  return id;
}

int32_t Sampler::sample_with_draw(std::span<float> logits, const TokenCounts& generated,
                                  std::span<const int32_t> suppressed, double u) {
  if (!(u >= 0.0 && u < 1.0)) throw std::invalid_argument("the draw must be in [0, 1)");
  const int32_t id = choose(logits, generated, suppressed, u);
  if (id < 0) throw std::runtime_error(sampled_code_error(id));
  return id;
}

int32_t Sampler::choose(std::span<float> logits, const TokenCounts& generated, std::span<const int32_t> suppressed,
                        double u) {
  apply_penalties(logits, generated);
  const auto vocab = static_cast<int64_t>(logits.size());
  for (int32_t id : suppressed)
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();

  float best = -std::numeric_limits<float>::infinity();
  int32_t best_id = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (std::isnan(l)) return kSampledNaN;
    if (l > best) {
      best = l;
      best_id = static_cast<int32_t>(i);
    }
  }
  if (best_id < 0 || std::isinf(best)) return kSampledNothing;
  if (params_.temperature <= 0.0f) return best_id;

  const float inv_temperature = 1.0f / params_.temperature;
  candidates_.clear();
  if (params_.top_k > 0 && params_.top_k < vocab) {
    // Logits order tokens exactly as their weights do: select the top k on the raw logits
    // and exponentiate only the survivors.
    for (int64_t i = 0; i < vocab; ++i) candidates_.push_back({logits[i], static_cast<int32_t>(i)});
    keep_top_k();
    for (auto& c : candidates_) c.weight = std::exp((c.weight - best) * inv_temperature);
    std::erase_if(candidates_, [](const Candidate& c) { return !(c.weight > 0.0f); });
  } else {
    for (int64_t i = 0; i < vocab; ++i) {
      const float w = std::exp((logits[i] - best) * inv_temperature);
      if (w > 0.0f) candidates_.push_back({w, static_cast<int32_t>(i)});
    }
  }
  keep_top_p();
  keep_min_p();

  double total = 0.0;
  for (const auto& c : candidates_) total += c.weight;
  const double target = (u < 0.0 ? uniform01() : u) * total;
  double cumulative = 0.0;
  for (const auto& c : candidates_) {
    cumulative += c.weight;
    if (target < cumulative) return c.id;
  }
  return candidates_.back().id;  // only reached through rounding in the last addition
}

void Sampler::keep_top_k() {
  const auto k = static_cast<size_t>(params_.top_k);
  if (params_.top_k <= 0 || k >= candidates_.size()) return;
  std::nth_element(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   candidates_.end(), MoreProbable{});
  candidates_.resize(k);
  // Back to id order: the draw scans in it unless top_p sorts the set.
  std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
}

void Sampler::keep_top_p() {
  if (params_.top_p >= 1.0f) return;
  double total = 0.0;
  for (const auto& c : candidates_) total += c.weight;
  const double target = static_cast<double>(params_.top_p) * total;
  const auto at = [this](size_t i) { return candidates_.begin() + static_cast<std::ptrdiff_t>(i); };
  const auto keep_through = [this](size_t i) { candidates_.resize(i + 1); };

  // Usually a few tokens carry the mass: sort growing heads (a heap pass over the rest is
  // cheap while the head is small).
  constexpr size_t kFirstHead = 64, kLastHead = 1024;
  size_t lo = 0;  // [0, lo) are the lo most probable candidates, in order
  double below_lo = 0.0;  // their mass
  for (size_t head = kFirstHead; lo < candidates_.size() && lo < kLastHead; head *= 4) {
    const size_t end = std::min(head, candidates_.size());
    std::partial_sort(at(lo), at(end), candidates_.end(), MoreProbable{});
    for (; lo < end; ++lo) {
      below_lo += candidates_[lo].weight;
      if (below_lo >= target) return keep_through(lo);
    }
  }
  // A flat tail: bisect the rest with selections (linear time overall). Invariant: [0, lo)
  // are the lo most probable candidates (in order up to `ordered`), and the cut lies in
  // [lo, hi).
  const size_t ordered = lo;
  size_t hi = candidates_.size();
  while (hi - lo > kFirstHead) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(at(lo), at(mid), at(hi), MoreProbable{});
    double upper = 0.0;
    for (size_t i = lo; i < mid; ++i) upper += candidates_[i].weight;
    if (below_lo + upper >= target) {
      hi = mid;
    } else {
      below_lo += upper;
      lo = mid;
    }
  }
  std::sort(at(lo), at(hi), MoreProbable{});
  // The draw scans the kept set most probable first: order what the selections left unordered
  // (a cost only the flat case pays, where the kept set outgrows the sorted heads).
  for (size_t i = lo; i < hi; ++i) {
    below_lo += candidates_[i].weight;
    if (below_lo >= target) {
      std::sort(at(ordered), at(lo), MoreProbable{});
      return keep_through(i);
    }
  }
  // Rounding left the target just out of reach: every candidate stays.
  std::sort(at(ordered), candidates_.end(), MoreProbable{});
}

void Sampler::keep_min_p() {
  if (params_.min_p <= 0.0f) return;
  // The best token weighs exactly 1, so the threshold is min_p itself.
  const float threshold = params_.min_p;
  std::erase_if(candidates_, [threshold](const Candidate& c) { return c.weight < threshold; });
}

std::string sampled_code_error(int32_t code) {
  switch (code) {
    case kSampledNaN: return "model produced a NaN logit";
    case kSampledNothing: return "no token can be sampled: every logit is -inf or +inf";
    default: return "the device sampler returned the unknown code " + std::to_string(code);
  }
}

int32_t sample_row_on_host(std::span<float> logits, const SamplingBatch& batch, size_t row) {
  const RowSampling& r = batch.rows.at(row);
  SamplingParams params;
  params.temperature = r.temperature;
  params.top_p = r.top_p;
  params.top_k = r.top_k;
  params.min_p = r.min_p;
  params.presence_penalty = r.presence_penalty;
  params.frequency_penalty = r.frequency_penalty;
  TokenCounts generated;
  for (int32_t i = r.penalty_begin; i < r.penalty_begin + r.penalty_count; ++i)
    generated[batch.penalty_tokens.at(static_cast<size_t>(i))] += batch.penalty_counts.at(static_cast<size_t>(i));
  if (r.suppressed_begin < 0 || r.suppressed_count < 0 ||
      static_cast<size_t>(r.suppressed_begin) + static_cast<size_t>(r.suppressed_count) > batch.suppressed.size())
    throw std::out_of_range("sampling row " + std::to_string(row) + ": suppressed ids outside the batch");
  const auto suppressed = std::span(batch.suppressed)
                              .subspan(static_cast<size_t>(r.suppressed_begin), static_cast<size_t>(r.suppressed_count));
  if (r.mask_begin >= 0) {
    if (!(static_cast<size_t>(r.mask_begin) + static_cast<size_t>(batch.bitmask_words) <= batch.bitmask.size()))
      throw std::out_of_range("sampling row " + std::to_string(row) + ": bitmask outside the batch");
    apply_token_bitmask(logits, std::span(batch.bitmask)
                                    .subspan(static_cast<size_t>(r.mask_begin), static_cast<size_t>(batch.bitmask_words)));
  }
  Sampler sampler(params, 0);
  return sampler.choose(logits, generated, suppressed, r.temperature > 0.0f ? r.uniform : 0.0);
}

}  // namespace ninfer
