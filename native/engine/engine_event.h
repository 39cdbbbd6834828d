// What the engine tells its caller about a request, one record per committed step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/constraint_matcher.h"

namespace ninfer {

enum class EventKind : uint8_t {
  Admitted,      // the request got a lane (no tokens yet)
  Output,        // committed tokens; the last Output of a request has finished = true
  QueueTimeout,  // the request waited past its pending deadline; it is finished
  PromptProgress,  // a prefill chunk committed and prompt remains (only with report_progress)
};

enum class FinishReason : uint8_t { None, Stop, Length, Cancelled, Error };

const char* finish_reason_name(FinishReason reason);  // "stop", "length", ... ("" for None)

// Why a request stopped with FinishReason::Stop.
enum class StopKind : uint8_t { None, Eos, TokenId, String };

struct RequestTimings {
  double queue_ms = 0;      // submit -> lane
  double prompt_ms = 0;     // lane -> prefill done
  double predicted_ms = 0;  // prefill done -> last commit
  double decode_share_ms = 0;  // the request's share of its decode rounds (see Sequence)
};

// How pressure pauses affected one request (a request is paused to let an older one grow,
// and restored by replaying its prompt and output from the deepest cached prefix).
struct RequestScheduling {
  int32_t preemptions = 0;      // times the request was paused
  int64_t replayed_tokens = 0;  // tokens recomputed by its replays (no new output)
  double paused_ms = 0;         // time spent paused
};

struct EngineEvent {
  uint64_t request_id = 0;
  EventKind kind = EventKind::Output;
  std::vector<int32_t> token_ids;  // committed this step, including a stop token whose text is withheld
  std::string text;                // bytes safe to show; may end inside a UTF-8 sequence
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  StopKind stop_kind = StopKind::None;
  int32_t stop_token = -1;  // StopKind::Eos / TokenId
  std::string stop_string;  // StopKind::String
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens reused from the prefix cache (fixed at admission)
  int32_t prompt_processed = 0;  // prompt tokens whose K/V are committed (the prompt's frontier)
  int32_t completion_tokens = 0;
  RequestTimings timings;
  RequestScheduling scheduling;
  std::string error;  // FinishReason::Error
  std::optional<ConstraintStats> constraint;  // constrained requests, on the finished event
  std::vector<float> logits;  // GenerationParams::capture_logits: [token_ids.size(), vocab]
};

}  // namespace ninfer
