// Stop strings matched on output bytes across token boundaries.
//
// Bytes go in as tokens are committed. The matcher releases every byte that can no longer be
// part of a stop string and holds back only the longest suffix that is still a proper prefix
// of some stop string. Because of that invariant a match can only begin inside the held-back
// suffix, so each push searches a buffer no longer than the longest stop string plus the new
// bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ninfer {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string released;           // bytes safe to show
    std::optional<size_t> matched;  // index of the stop string that matched, if any
  };
  // Appends `bytes`. With `may_match` false (min_tokens not yet reached) stop strings are
  // inert for these bytes. After a match, `released` holds the text before the match and the
  // matcher discards the rest.
  Result push(std::string_view bytes, bool may_match);
  // Releases the held-back bytes (the output ended for another reason).
  std::string flush();

  const std::vector<std::string>& stops() const { return stops_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  size_t longest_open_prefix() const;

  std::vector<std::string> stops_;
  std::string held_;
  size_t inert_ = 0;  // leading bytes of held_ pushed while stops were inert
};

}  // namespace ninfer
