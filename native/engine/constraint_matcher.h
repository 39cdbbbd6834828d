// One request's position in its output constraint: which tokens may come next (a packed
// bitmask over the model's vocabulary), advanced by every committed token.
//
// A constraint may start late: with thinking enabled it waits for the end-of-thinking token,
// since reasoning is never constrained. Work counters feed the constraint observation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/grammar_compiler.h"

namespace xgrammar {
class GrammarMatcher;
}

namespace ninfer {

// What a constrained request reports when it settles.
struct ConstraintStats {
  bool complete = false;    // the committed output is a complete sentence of the language
  bool terminated = false;  // ... and the model's EOS was accepted after it
  CacheResult cache = CacheResult::Built;
  int64_t mask_positions = 0;     // positions sampled under a mask
  int64_t mask_upload_bytes = 0;  // bitmask bytes handed to the sampler (device or host)
  double prepare_seconds = 0.0;   // compile / cache lookup before submit
  double mask_seconds = 0.0;      // computing masks
  double matcher_seconds = 0.0;   // advancing the matcher on committed tokens
};

class ConstraintMatcher {
 public:
  // `start_after` >= 0: the constraint applies only after that token has been generated.
  // `prefix`: text the output already starts with, consumed first (std::invalid_argument
  // when the grammar rejects it; only without `start_after`).
  ConstraintMatcher(std::shared_ptr<const CompiledConstraint> constraint, int64_t vocab_size,
                    int32_t start_after = -1, const std::string& prefix = {});
  ~ConstraintMatcher();
  ConstraintMatcher(ConstraintMatcher&&) noexcept;
  ConstraintMatcher& operator=(ConstraintMatcher&&) noexcept;

  bool active() const { return active_; }
  int32_t bitmask_words() const { return static_cast<int32_t>((vocab_size_ + 31) / 32); }
  // Writes the allowed next tokens into `bitmask` (bitmask_words() words, bit i%32 of word
  // i/32 set = token i allowed). Returns how many tokens are allowed (0: a dead end).
  int64_t fill_next_mask(std::span<uint32_t> bitmask);
  // Advances over a committed token. An inactive constraint only watches for its start token.
  // False when the grammar rejects the token (the mask was not applied to its draw).
  bool accept(int32_t token);
  // Undoes the last `tokens` accepted tokens (speculative drafts that were not verified).
  void rollback(int tokens);
  bool complete() const;
  bool terminated() const;

  ConstraintStats& stats() { return stats_; }
  // The stats with complete / terminated filled in.
  ConstraintStats settle() const;

 private:
  std::shared_ptr<const CompiledConstraint> constraint_;
  std::unique_ptr<xgrammar::GrammarMatcher> matcher_;
  int64_t vocab_size_;
  int32_t start_after_;
  bool active_;
  ConstraintStats stats_;
};

// Sets the logit of every token that `bitmask` does not allow to -inf, including ids past
// the bitmask's coverage.
void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> bitmask);
int64_t count_allowed(std::span<const uint32_t> bitmask, int64_t vocab_size);

}  // namespace ninfer
