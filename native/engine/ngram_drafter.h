// n-gram copy drafting: proposals copied from a request's own prompt and output.
//
// When the last `min_match` tokens of the history (prompt + committed output) occurred
// before, the tokens that followed their latest earlier occurrence are proposed; where that
// copy runs into the suffix itself (a repeating pattern), it continues with the same period.
// The index maps a hash of every min_match-gram to the end of its latest occurrence and is
// extended as tokens commit, so a proposal costs one lookup and one comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ninfer {

class NgramDrafter {
 public:
  explicit NgramDrafter(int32_t min_match) : min_match_(min_match) {}

  // Brings the history up to prompt + output (both only ever grow).
  void sync(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output);
  // Up to `max_tokens` proposals for the tokens after the history; empty without a match.
  std::vector<int32_t> propose(int32_t max_tokens);

 private:
  uint64_t gram_hash(size_t end) const;  // of history_[end - min_match, end)

  int32_t min_match_;
  std::vector<int32_t> history_;
  size_t indexed_end_ = 0;  // grams ending before this position are in latest_end_
  std::unordered_map<uint64_t, size_t> latest_end_;
};

}  // namespace ninfer
