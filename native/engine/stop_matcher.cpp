#include "engine/stop_matcher.h"

#include <algorithm>
#include <stdexcept>

namespace ninfer {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_)
    if (s.empty()) throw std::invalid_argument("stop strings must not be empty");
}

StopMatcher::Result StopMatcher::push(std::string_view bytes, bool may_match) {
  Result result;
  held_.append(bytes);
  if (stops_.empty()) {
    result.released.swap(held_);
    return result;
  }
  if (!may_match) {
    inert_ = held_.size();
  } else {
    // Earliest match wins; among matches at the same offset, the stop listed first. A match
    // must end in bytes pushed while stops were live.
    size_t best_pos = std::string::npos;
    for (size_t i = 0; i < stops_.size(); ++i) {
      const size_t len = stops_[i].size();
      const size_t from = inert_ >= len ? inert_ - len + 1 : 0;
      const size_t pos = held_.find(stops_[i], from);
      if (pos < best_pos) {
        best_pos = pos;
        result.matched = i;
      }
    }
    if (result.matched) {
      result.released = held_.substr(0, best_pos);
      held_.clear();
      inert_ = 0;
      return result;
    }
  }
  const size_t keep = longest_open_prefix();
  const size_t released = held_.size() - keep;
  result.released = held_.substr(0, released);
  held_.erase(0, released);
  inert_ = inert_ > released ? inert_ - released : 0;
  return result;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  inert_ = 0;
  return out;
}

size_t StopMatcher::longest_open_prefix() const {
  size_t longest = 0;
  for (const auto& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, held_.size());
    for (size_t len = max_len; len > longest; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(stop).substr(0, len)) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

}  // namespace ninfer
