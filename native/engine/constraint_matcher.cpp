#include "engine/constraint_matcher.h"

#include <xgrammar/xgrammar.h>

#include <bit>
#include <chrono>
#include <limits>
#include <stdexcept>

namespace ninfer {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> constraint, int64_t vocab_size,
                                     int32_t start_after, const std::string& prefix)
    : constraint_(std::move(constraint)), vocab_size_(vocab_size), start_after_(start_after), active_(start_after < 0) {
  if (!constraint_ || !constraint_->grammar) throw std::invalid_argument("a constraint needs a compiled grammar");
  matcher_ = std::make_unique<xgrammar::GrammarMatcher>(*constraint_->grammar);
  if (prefix.empty()) return;
  if (!active_) throw std::invalid_argument("a constraint that starts after a token cannot take a prefix");
  if (!matcher_->AcceptString(prefix))
    throw std::invalid_argument("the answer's existing text does not match its output constraint");
}

ConstraintMatcher::~ConstraintMatcher() = default;
ConstraintMatcher::ConstraintMatcher(ConstraintMatcher&&) noexcept = default;
ConstraintMatcher& ConstraintMatcher::operator=(ConstraintMatcher&&) noexcept = default;

int64_t ConstraintMatcher::fill_next_mask(std::span<uint32_t> bitmask) {
  if (static_cast<int64_t>(bitmask.size()) != bitmask_words())
    throw std::invalid_argument("the bitmask has " + std::to_string(bitmask.size()) + " words, expected " +
                                std::to_string(bitmask_words()));
  const auto start = std::chrono::steady_clock::now();
  int64_t shape[1] = {static_cast<int64_t>(bitmask.size())};
  DLTensor tensor{};
  tensor.data = bitmask.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = shape;
  matcher_->FillNextTokenBitmask(&tensor);
  const int64_t allowed = count_allowed(bitmask, vocab_size_);
  stats_.mask_seconds += seconds_since(start);
  stats_.mask_positions += 1;
  stats_.mask_upload_bytes += static_cast<int64_t>(bitmask.size_bytes());
  return allowed;
}

bool ConstraintMatcher::accept(int32_t token) {
  if (!active_) {
    if (token == start_after_) active_ = true;
    return true;
  }
  const auto start = std::chrono::steady_clock::now();
  const bool accepted = matcher_->AcceptToken(token);
  stats_.matcher_seconds += seconds_since(start);
  return accepted;
}

void ConstraintMatcher::rollback(int tokens) {
  if (tokens > 0) matcher_->Rollback(tokens);
}

bool ConstraintMatcher::complete() const { return active_ && matcher_->IsCompleted(); }
bool ConstraintMatcher::terminated() const { return active_ && matcher_->IsTerminated(); }

ConstraintStats ConstraintMatcher::settle() const {
  ConstraintStats s = stats_;
  s.complete = complete() || terminated();
  s.terminated = terminated();
  return s;
}

void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> bitmask) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const size_t covered = std::min(logits.size(), bitmask.size() * 32);
  for (size_t word = 0; word * 32 < covered; ++word) {
    const uint32_t bits = bitmask[word];
    if (bits == 0xFFFFFFFFu) continue;
    const size_t end = std::min(covered, word * 32 + 32);
    for (size_t i = word * 32; i < end; ++i)
      if (!((bits >> (i - word * 32)) & 1u)) logits[i] = kMasked;
  }
  for (size_t i = covered; i < logits.size(); ++i) logits[i] = kMasked;
}

int64_t count_allowed(std::span<const uint32_t> bitmask, int64_t vocab_size) {
  int64_t allowed = 0;
  const int64_t full_words = std::min<int64_t>(vocab_size / 32, static_cast<int64_t>(bitmask.size()));
  for (int64_t w = 0; w < full_words; ++w) allowed += std::popcount(bitmask[static_cast<size_t>(w)]);
  if (full_words < static_cast<int64_t>(bitmask.size()) && vocab_size % 32 != 0) {
    const uint32_t tail = bitmask[static_cast<size_t>(full_words)] & ((1u << (vocab_size % 32)) - 1u);
    allowed += std::popcount(tail);
  }
  return allowed;
}

}  // namespace ninfer
