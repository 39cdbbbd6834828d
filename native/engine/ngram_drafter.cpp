#include "engine/ngram_drafter.h"

#include <algorithm>

namespace ninfer {

uint64_t NgramDrafter::gram_hash(size_t end) const {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the token ids
  for (size_t i = end - static_cast<size_t>(min_match_); i < end; ++i) {
    h ^= static_cast<uint32_t>(history_[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

void NgramDrafter::sync(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  const size_t total = prompt.size() + output.size();
  while (history_.size() < total) {
    const size_t i = history_.size();
    history_.push_back(i < prompt.size() ? prompt[i] : output[i - prompt.size()]);
  }
  // Every gram but the suffix itself (the one a proposal looks up).
  const size_t m = static_cast<size_t>(min_match_);
  for (size_t end = std::max(indexed_end_, m); end < history_.size(); ++end) latest_end_[gram_hash(end)] = end;
  indexed_end_ = std::max(indexed_end_, history_.size());
}

std::vector<int32_t> NgramDrafter::propose(int32_t max_tokens) {
  std::vector<int32_t> out;
  const size_t m = static_cast<size_t>(min_match_), len = history_.size();
  if (max_tokens <= 0 || len <= m) return out;
  const auto it = latest_end_.find(gram_hash(len));
  if (it == latest_end_.end()) return out;
  const size_t end = it->second;
  if (end >= len || !std::equal(history_.begin() + static_cast<std::ptrdiff_t>(end - m),
                                history_.begin() + static_cast<std::ptrdiff_t>(end),
                                history_.begin() + static_cast<std::ptrdiff_t>(len - m)))
    return out;  // a hash collision
  const size_t period = len - end;
  for (int32_t j = 0; j < max_tokens; ++j) {
    size_t pos = end + static_cast<size_t>(j);
    if (pos >= len) pos = end + (pos - end) % period;
    out.push_back(history_[pos]);
  }
  return out;
}

}  // namespace ninfer
