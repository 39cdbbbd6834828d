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
  Scheduling,      // a pause/restore transition of the request (see SchedulingTransition)
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
  int32_t draft_n = 0;           // speculative proposals verified so far
  int32_t draft_n_accepted = 0;  // of which accepted
};

// A request's speculative work so far (carried by its finished event, for the request log).
struct SpeculativeTally {
  int32_t rounds = 0;          // decode rows that verified proposals
  int32_t drafted = 0;         // proposals verified
  int32_t accepted = 0;        // of which accepted
  int32_t ngram_rounds = 0;    // the part whose proposals were n-gram copies
  int32_t ngram_drafted = 0;
  int32_t ngram_accepted = 0;
  int32_t fallback_steps = 0;  // decode rows with nothing to verify
  std::vector<int32_t> accepted_per_position;  // [i]: rounds whose proposal i was accepted
};

// How pressure pauses affected one request (a request is paused to let an older one grow,
// and restored by replaying its prompt and output from the deepest cached prefix).
struct RequestScheduling {
  int32_t preemptions = 0;      // times the request was paused
  int64_t replayed_tokens = 0;  // tokens recomputed by its replays (no new output)
  double paused_ms = 0;         // time spent paused
};

// Token work counters at a scheduling transition: initial prefill, decode/control outputs
// after each request's first, and replay recomputation.
struct WorkProgress {
  uint64_t prefill = 0, decode = 0, replay = 0;
};

// One boundary of a pause cycle: pause_started, paused, restore_started, restored,
// replay_complete, recovery_complete. Pausing and binding take no separate time here (pages
// are dropped and reserved inside one step boundary), so each pair shares its timestamp.
struct SchedulingTransition {
  std::string name;
  int32_t preemption_index = 0;  // the pause cycle, 1 for the first
  std::string route;             // "replay" (every restore rebuilds state by replaying)
  int64_t steady_ns = 0;         // the worker's steady clock
  int64_t elapsed_ns = 0;        // since the request was submitted
  WorkProgress global, request;  // the engine's and this request's completed work
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
  std::optional<SchedulingTransition> transition;  // EventKind::Scheduling
  std::string error;  // FinishReason::Error
  SpeculativeTally speculative;  // finished events only
  std::optional<ConstraintStats> constraint;  // constrained requests, on the finished event
  std::vector<float> logits;  // GenerationParams::capture_logits: [token_ids.size(), vocab]
};

}  // namespace ninfer
