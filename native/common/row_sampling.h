// Sampling on the model's device: what one step asks for each logit row, so that only the
// chosen token ids come back to the host (the engine's Sampler semantics, engine/sampler.h).
//
// The engine keeps each sequence's seeded generator and draws the row's uniform value itself;
// a backend that samples picks the token the Sampler would pick with that draw.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

namespace ninfer {

// One logit row's parameters. Plain data: a backend uploads an array of them as bytes.
struct RowSampling {
  float temperature = 0.0f;  // <= 0: greedy argmax (no draw)
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_k = 0;
  double uniform = 0.0;  // the row's draw in [0, 1)
  int32_t penalty_begin = 0, penalty_count = 0;        // SamplingBatch::penalty_tokens/_counts
  int32_t suppressed_begin = 0, suppressed_count = 0;  // SamplingBatch::suppressed
  int32_t mask_begin = -1;  // first word of the row's grammar bitmask in SamplingBatch::bitmask;
                            // -1: unconstrained. Tokens without their bit set are never chosen.
};
static_assert(sizeof(RowSampling) == 56, "RowSampling is uploaded as raw bytes");

// Written instead of a token id where the Sampler would throw.
inline constexpr int32_t kSampledNaN = -1;      // a logit is NaN
inline constexpr int32_t kSampledNothing = -2;  // every logit is -inf or one is +inf

// One step's rows with their penalty (token, count) pairs, suppressed ids and grammar
// bitmasks, flattened.
struct SamplingBatch {
  std::vector<RowSampling> rows;  // one per logit row, in row order
  std::vector<int32_t> penalty_tokens, penalty_counts;
  std::vector<int32_t> suppressed;
  // Packed token bitmasks of the constrained rows (bit t%32 of word t/32 set = token t
  // allowed; ids past bitmask_words * 32 are never allowed), bitmask_words words each.
  std::vector<uint32_t> bitmask;
  int32_t bitmask_words = 0;

  void clear() {
    rows.clear();
    penalty_tokens.clear();
    penalty_counts.clear();
    suppressed.clear();
    bitmask.clear();
    bitmask_words = 0;
  }
  // Appends a row; `row`'s list offsets are set here. A non-empty `mask` constrains it (every
  // masked row of a batch has the same number of words).
  void add_row(RowSampling row, std::span<const int32_t> tokens, std::span<const int32_t> counts,
               std::span<const int32_t> suppressed_ids, std::span<const uint32_t> mask = {}) {
    row.mask_begin = -1;
    if (!mask.empty()) {
      if (bitmask_words == 0) bitmask_words = static_cast<int32_t>(mask.size());
      if (static_cast<size_t>(bitmask_words) != mask.size())
        throw std::invalid_argument("sampling batch: every bitmask of a batch has the same length");
      row.mask_begin = static_cast<int32_t>(bitmask.size());
      bitmask.insert(bitmask.end(), mask.begin(), mask.end());
    }
    if (tokens.size() != counts.size()) throw std::invalid_argument("penalty tokens and counts differ in length");
    row.penalty_begin = static_cast<int32_t>(penalty_tokens.size());
    row.penalty_count = static_cast<int32_t>(tokens.size());
    penalty_tokens.insert(penalty_tokens.end(), tokens.begin(), tokens.end());
    penalty_counts.insert(penalty_counts.end(), counts.begin(), counts.end());
    row.suppressed_begin = static_cast<int32_t>(suppressed.size());
    row.suppressed_count = static_cast<int32_t>(suppressed_ids.size());
    suppressed.insert(suppressed.end(), suppressed_ids.begin(), suppressed_ids.end());
    rows.push_back(row);
  }
  // Throws std::invalid_argument unless every row's lists lie inside the batch's arrays.
  void validate() const {
    if (penalty_tokens.size() != penalty_counts.size())
      throw std::invalid_argument("sampling batch: penalty tokens and counts differ in length");
    const auto inside = [](int32_t begin, int32_t count, size_t size) {
      return begin >= 0 && count >= 0 && static_cast<size_t>(begin) + static_cast<size_t>(count) <= size;
    };
    for (const RowSampling& r : rows)
      if (!inside(r.penalty_begin, r.penalty_count, penalty_tokens.size()) ||
          !inside(r.suppressed_begin, r.suppressed_count, suppressed.size()) ||
          !(r.mask_begin == -1 || inside(r.mask_begin, bitmask_words, bitmask.size())) ||
          !(r.uniform >= 0.0 && r.uniform < 1.0))
        throw std::invalid_argument("sampling batch: a row's lists lie outside the batch or its draw outside [0, 1)");
  }
};

}  // namespace ninfer
