// A request's thinking-token cap, decided on committed tokens inside the engine.
//
// While thinking is open, every committed token counts. Once `limit` tokens were committed in
// the open thinking block and it is still open, the next tokens are not sampled: the engine
// commits `close_ids` (the early-close guidance ending in the close marker) one per step, in
// the same sequence the model reads, then sampling resumes. A natural close marker, a stop,
// the output limit or a cancellation all act first, because they are decided when the token
// before the cap is committed. The cap applies at most once per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace ninfer {

struct ThinkingBudgetParams {
  int32_t limit = -1;            // thinking tokens before the close is forced; -1 = no cap
  bool starts_open = false;      // the prompt ends inside an opened thinking block
  int32_t open_id = -1;          // committing it opens thinking (model-opened thinking); -1 = none
  int32_t close_id = -1;         // committing it closes thinking; -1 = none
  std::vector<int32_t> close_ids;  // committed without sampling when the cap is reached

  bool active() const { return limit >= 0; }
};

class ThinkingBudget {
 public:
  explicit ThinkingBudget(ThinkingBudgetParams params) : p_(std::move(params)), open_(p_.starts_open) {}

  // Whether the next output token is forced (no sampling needed for it).
  bool forcing_next() const { return forcing_ || cap_reached(); }

  // The forced token for the next position, advancing the forced run; none = sample.
  std::optional<int32_t> next_forced() {
    if (!forcing_ && cap_reached()) {
      forcing_ = true;
      applied_ = true;
    }
    if (!forcing_) return std::nullopt;
    const int32_t token = p_.close_ids[next_];
    if (++next_ == p_.close_ids.size()) forcing_ = false;
    return token;
  }

  // Every committed token, sampled or forced, in order.
  void observe(int32_t token) {
    if (open_) {
      ++thinking_tokens_;
      if (token == p_.close_id) open_ = false;
    } else if (token == p_.open_id && p_.open_id >= 0 && !closed_once_) {
      open_ = true;
    }
    if (!open_ && thinking_tokens_ > 0) closed_once_ = true;
  }

  bool open() const { return open_; }
  bool applied() const { return applied_; }
  int32_t thinking_tokens() const { return thinking_tokens_; }

 private:
  bool cap_reached() const {
    return p_.active() && !applied_ && open_ && !p_.close_ids.empty() && thinking_tokens_ >= p_.limit;
  }

  ThinkingBudgetParams p_;
  bool open_;
  bool forcing_ = false;
  bool applied_ = false;
  bool closed_once_ = false;  // thinking opens once per turn
  int32_t thinking_tokens_ = 0;
  size_t next_ = 0;
};

}  // namespace ninfer
