"""What happens to every generation request, reported once: console record, JSONL, histograms.

`run_generation` (server/generation.py) is the one place every protocol submits through; it
opens a `RequestRecord` after the engine accepted the request, hands the protocol an
`ObservedHandle` (the engine handle, watched: admission, first token, final event) and
settles the record when the protocol's answer is over. A synchronous rejection (validation,
a full queue) is reported from the app's error boundary. So a new route is logged and
counted by calling `run_generation`, without code of its own; it may add its turn's
diagnostics with `generation.report_turn`.

Exactly one terminal JSONL record follows each `request_start`: `request_done` for a
completed generation, `request_error` for a cancellation, failure or queue timeout.
Console records never carry prompts, bodies, keys or client-supplied text.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from ninfer.engine_types import EngineEvent, GenerationRequest, QueueTimeout
from ninfer.server import console_units as units
from ninfer.server.errors import ApiError
from ninfer.server.metrics import ServerMetrics
from ninfer.server.request_log import SCHEMA, SCHEMA_VERSION, RequestLog
from ninfer.server.session_stats import RequestSample, SessionStats

log = logging.getLogger("ninfer.server")

# Paths whose synchronous rejections are generation attempts (token counting is not).
GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}
)


def protocol_of(path: str) -> str:
    """The route's name, e.g. `chat/completions` (bounded: one per route)."""
    if path.startswith("/v1/v1/"):
        path = path[3:]
    return path.removeprefix("/v1/").strip("/")


@dataclass(slots=True)
class RequestRecord:
    number: int  # req#N: monotonic within this server instance
    http_request_id: str
    protocol: str
    prompt_tokens: int
    received: float  # perf_counter at the request's arrival
    submitted: float
    admitted: float | None = None
    first_token: float | None = None
    final: EngineEvent | None = None
    admission_error: Exception | None = None
    generated_token_ids: list[int] = field(default_factory=list)
    turn: Any = None  # the protocol's TurnResult, when it reported one
    constraint: dict[str, Any] | None = None  # the constraint observation the response carried
    engine_request_id: int | None = None  # the core's id (its scheduling events name it)


class ObservedHandle:
    """An engine RequestHandle with the same contract, whose progress the record follows."""

    def __init__(self, handle: Any, record: RequestRecord, telemetry: Telemetry) -> None:
        self._handle = handle
        self.record = record
        self._telemetry = telemetry
        self._events: Any = None

    def __getattr__(self, name: str) -> Any:
        if name == "next_within":
            # Streams read a RequestHandle through next_within (sse.with_heartbeat); the
            # wrapper observes it like __anext__. Absent when the wrapped handle lacks it.
            return functools.partial(self._next_within, getattr(self._handle, name))
        return getattr(self._handle, name)

    async def _next_within(self, inner: Any, timeout: float | None) -> EngineEvent | None:
        try:
            event = await inner(timeout)
        except StopAsyncIteration:
            raise
        except Exception as exc:
            if self.record.admitted is None:
                self.record.admission_error = exc
            raise
        return None if event is None else self._observe(event)

    def cancel(self) -> None:
        self._handle.cancel()

    async def admitted(self) -> None:
        try:
            await self._handle.admitted()
        except Exception as exc:
            self.record.admission_error = exc
            raise
        if self.record.admitted is None:
            self.record.admitted = time.perf_counter()

    def __aiter__(self) -> ObservedHandle:
        if self._events is None:
            self._events = self._handle.__aiter__()
        return self

    async def __anext__(self) -> EngineEvent:
        if self._events is None:
            self._events = self._handle.__aiter__()
        try:
            event = await self._events.__anext__()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            if self.record.admitted is None:
                self.record.admission_error = exc
            raise
        return self._observe(event)

    def _observe(self, event: EngineEvent) -> EngineEvent:
        record = self.record
        if record.admitted is None:
            record.admitted = time.perf_counter()
        if event.token_ids:
            record.generated_token_ids += event.token_ids
            if record.first_token is None:
                record.first_token = time.perf_counter()
                self._telemetry.first_token(record)
        if event.finished:
            record.final = event
        return event


class Telemetry:
    def __init__(
        self,
        metrics: ServerMetrics | None = None,
        request_log: RequestLog | None = None,
        *,
        server_instance_id: str | None = None,
    ) -> None:
        self.metrics = metrics
        self.request_log = request_log
        self.server_instance_id = server_instance_id or uuid.uuid4().hex
        self.session = SessionStats()
        self._numbers = itertools.count(1)
        self.on_change: list[Any] = []  # callbacks after each settled request (the panel)
        # After a fatal device error the process exits as a crash would: the requests in
        # flight get no terminal JSONL record (their clients still get an error answer).
        self.device_failed = False
        self._by_engine_id: dict[int, RequestRecord] = {}  # started, not yet settled

    # --- records -------------------------------------------------------------------------

    def base(self, event: str) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "event": event,
            "timestamp_unix_ms": int(time.time() * 1000),
            "server_instance_id": self.server_instance_id,
        }

    def write(self, record: dict[str, Any]) -> None:
        if self.request_log is None:
            return
        if self.device_failed and record.get("event") in _TERMINAL_EVENTS:
            return
        self.request_log.write(record)

    # --- lifecycle -----------------------------------------------------------------------

    def start(
        self,
        request: Any,
        generation: GenerationRequest,
        shape: dict[str, Any] | None,
        seed: int | None = None,
        *,
        engine_request_id: int | None = None,
    ) -> RequestRecord:
        now = time.perf_counter()
        record = RequestRecord(
            number=next(self._numbers),
            http_request_id=request.request_id,
            protocol=protocol_of(request.path),
            prompt_tokens=len(generation.prompt_ids),
            received=getattr(request, "received", now),
            submitted=now,
        )
        request.generation_number = record.number
        if engine_request_id is not None:
            record.engine_request_id = engine_request_id
            self._by_engine_id[engine_request_id] = record
        if self.request_log is not None:
            start = self.base("request_start")
            start.update(
                request_id=record.number,
                http_request_id=record.http_request_id,
                protocol=record.protocol,
                prompt_tokens=record.prompt_tokens,
                max_tokens=generation.max_tokens,
                min_tokens=generation.min_tokens,
                sampling=asdict(generation.sampling) | {"seed": seed},
                ignore_eos=generation.ignore_eos,
                stop_token_ids=list(generation.stop_token_ids),
                stop_string_count=len(generation.stop_strings),
                shape=dict(shape or {}),
            )
            self.write(start)
        log.debug(
            "req#%d start: %s, prompt %d",
            record.number,
            record.protocol,
            len(generation.prompt_ids),
        )
        return record

    def first_token(self, record: RequestRecord) -> None:
        if self.metrics is not None and record.first_token is not None:
            self.metrics.histograms.time_to_first_token.observe(
                record.first_token - record.received
            )

    def rejected(self, request: Any, error: ApiError) -> None:
        """A generation request answered with an error before it reached a lane's queue."""
        if getattr(request, "generation_number", None) is not None:
            return  # it started: its terminal record is request_error
        if request.method != "POST" or _route_path(request.path) not in GENERATION_PATHS:
            return
        if error.status == 401:
            return  # not a request of this server's users: nothing was prepared
        self.session.rejected += 1
        self._changed()
        if self.request_log is None:
            return
        record = self.base("request_rejected")
        record.update(
            http_request_id=request.request_id,
            protocol=protocol_of(request.path),
            phase=getattr(request, "generation_phase", "prepare"),
            status=error.status,
            type=error.type,
            code=error.code,
            param=error.param,
            message=error.message,
        )
        self.write(record)

    def settle(
        self,
        record: RequestRecord,
        *,
        disconnected: bool,
        response_failed: bool,
        stopping: bool,
    ) -> None:
        """Once per started generation, after the protocol's answer ended."""
        now = time.perf_counter()
        final = record.final
        self._forget(record)
        preemptions = int(((final.scheduling if final else None) or {}).get("preemptions", 0))
        if preemptions:
            self._terminal_boundary(record, final, preemptions)
        reason = final.finish_reason if final is not None else None
        if self.metrics is not None and reason in ("stop", "length", "cancelled"):
            stats = getattr(final, "constraint", None)
            if stats is not None:  # settled constrained work, truncated or cancelled included
                self.metrics.constraints.observe(stats)
        if reason in ("stop", "length") and not response_failed:
            self._done(record, final, now)
        elif reason in ("stop", "length"):  # generated, but the answer itself failed
            if self.metrics is not None:
                self.metrics.response_failures += 1
            self._error(record, now, "response_failed", "the response could not be completed")
        elif reason == "cancelled" or (
            final is None and _cancelled(record, disconnected, stopping)
        ):
            why = "client disconnected" if disconnected else "server stopping" if stopping else None
            self._error(record, now, "cancelled", why or "cancelled")
        elif final is None and isinstance(record.admission_error, QueueTimeout):
            self._error(record, now, "queue_timeout", str(record.admission_error))
        else:
            message = (final.error if final is not None else None) or "the generation failed"
            self._error(record, now, "failed", message)
        self._changed()

    # --- pause/restore boundaries (request_scheduling) -------------------------------------

    def scheduling(self, engine_request_id: int, transition: dict[str, Any]) -> None:
        """AsyncEngine.on_scheduling: one boundary of a request's pause cycle."""
        record = self._by_engine_id.get(engine_request_id)
        if record is None or self.request_log is None:
            return
        out = self.base("request_scheduling")
        out.update(
            request_id=record.number,
            http_request_id=record.http_request_id,
            protocol=record.protocol,
            **transition,
        )
        self.write(out)
        log.debug(
            "req#%d %s (pause %d)",
            record.number,
            transition.get("transition"),
            transition.get("preemption_index", 0),
        )

    def _terminal_boundary(
        self, record: RequestRecord, final: EngineEvent | None, preemptions: int
    ) -> None:
        """The end of a preempted request's last pause cycle, before its terminal record."""
        if self.request_log is None:
            return
        out = self.base("request_scheduling")
        out.update(
            request_id=record.number,
            http_request_id=record.http_request_id,
            protocol=record.protocol,
            transition="terminal",
            preemption_index=preemptions,
            route="replay",
            finish_reason=final.finish_reason if final is not None else None,
        )
        self.write(out)

    def _forget(self, record: RequestRecord) -> None:
        if record.engine_request_id is not None:
            self._by_engine_id.pop(record.engine_request_id, None)

    # --- terminal records ----------------------------------------------------------------

    def _done(self, record: RequestRecord, final: EngineEvent, now: float) -> None:
        timings = final.timings
        prefill_s = timings.prompt_ms / 1000.0 if timings else 0.0
        decode_s = timings.predicted_ms / 1000.0 if timings else 0.0
        share_s = timings.decode_share_ms / 1000.0 if timings else 0.0
        queue_s = timings.queue_ms / 1000.0 if timings else 0.0
        ttft_s = (record.first_token - record.received) if record.first_token else None
        total_s = now - record.received
        completion = final.completion_tokens
        cached = getattr(final, "cached_tokens", 0) or 0  # the prefix cache's exact reuse
        prompt = final.prompt_tokens or record.prompt_tokens
        if self.metrics is not None:
            self.metrics.histograms.request_duration.observe(total_s)
            self.metrics.histograms.request_queue.observe(queue_s)
        self.session.add_completed(
            RequestSample(
                ttft_s=ttft_s or 0.0,
                prompt_tokens=prompt,
                cached_tokens=cached,
                prefill_s=prefill_s,
                decode_tokens=max(completion - 1, 0),
                decode_share_s=share_s,
                decode_wall_s=decode_s,
                **RequestSample.speculative_fields(getattr(final, "speculative", None)),
            )
        )
        decode_rate = (completion - 1) / decode_s if decode_s > 0 and completion > 1 else None
        log.info(
            "req#%d done: %s, prompt %d, %s, completion %d, TTFT %s, decode %s, finish %s, %s",
            record.number,
            record.protocol,
            prompt,
            _cache_summary(cached, prompt),
            completion,
            units.duration(ttft_s),
            units.rate(decode_rate),
            final.finish_reason,
            units.duration(total_s),
        )
        if self.request_log is None:
            return
        self.write(
            self._done_record(
                record, final, prompt=prompt, cached=cached, ttft_s=ttft_s, total_s=total_s
            )
        )

    def _done_record(
        self,
        record: RequestRecord,
        final: EngineEvent,
        *,
        prompt: int,
        cached: int,
        ttft_s: float | None,
        total_s: float,
    ) -> dict[str, Any]:
        """request_done, laid out as the schema in request_log.py describes."""
        timings = final.timings
        turn = record.turn
        report = getattr(turn, "report", None)
        usage = getattr(turn, "usage", None)
        scheduling = getattr(final, "scheduling", None) or {}
        preemptions = int(scheduling.get("preemptions", 0))
        out = self.base("request_done")
        out.update(
            request_id=record.number,
            http_request_id=record.http_request_id,
            protocol=record.protocol,
            result={
                "finish_reason": final.finish_reason,
                "response_finish_reason": getattr(turn, "finish_reason", None),
                "stop_kind": _stop_kind(final),
                "prompt_tokens": prompt,
                "completion_tokens": final.completion_tokens,
                "reasoning_tokens": getattr(usage, "reasoning_tokens", None),
                "prefix_cache_hit_tokens": cached,
                "prefill_tokens": prompt - cached,
                "prefix_reuse_path": _reuse_path(cached),
                "tool_call_parse": report.as_dict() if report is not None else None,
                "generated_token_ids": list(record.generated_token_ids),
            },
            generation={
                "scheduling": {
                    "preemptions": preemptions,
                    "snapshot_restores": 0,  # a paused request always replays (no pause images)
                    "replay_restores": preemptions,
                    "replayed_tokens": int(scheduling.get("replayed_tokens", 0)),
                    "paused_seconds": float(scheduling.get("paused_seconds", 0.0)),
                    "transfer_bytes": 0,  # host-tier copies are not attributed to requests yet
                },
                "admission": {
                    "preferred_reused_tokens": cached,
                    "source_wait_seconds": 0.0,  # admission never waits for a cache source
                    "revoked_checkpoints": 0,
                    "fallback_reason": "none",
                },
            },
            constraint=record.constraint,
            timings_seconds={
                "prepare": record.submitted - record.received,
                "ttft": ttft_s,
                "vision": None,  # no vision encoder in this build
                "prefill": timings.prompt_ms / 1000.0 if timings else 0.0,
                "decode": timings.predicted_ms / 1000.0 if timings else 0.0,
                "total": total_s,
            },
            # The core's per-request speculative tally (rounds, drafted/accepted tokens, their
            # n-gram part, fallback steps, accepted per position); null without speculation.
            speculative=getattr(final, "speculative", None),
            engine_timing={
                "queue_wait_seconds": timings.queue_ms / 1000.0 if timings else 0.0,
                # The request's share of its batched decode rounds (the panel's decode rate).
                "decode_share_seconds": timings.decode_share_ms / 1000.0 if timings else 0.0,
            },
        )
        return out

    def _error(self, record: RequestRecord, now: float, kind: str, message: str) -> None:
        total_s = now - record.received
        final = record.final
        if kind == "cancelled":
            self.session.cancelled += 1
            if self.metrics is not None:  # a settled outcome, unlike failures
                self.metrics.histograms.request_duration.observe(total_s)
                if final is not None and final.timings is not None:
                    self.metrics.histograms.request_queue.observe(final.timings.queue_ms / 1000.0)
            log.info(
                "req#%d cancelled: %s, %s after %s, completion %d",
                record.number,
                record.protocol,
                message,
                units.duration(total_s),
                len(record.generated_token_ids),
            )
        elif kind == "queue_timeout":
            self.session.rejected += 1
            log.warning(
                "req#%d queue timeout: %s after %s",
                record.number,
                record.protocol,
                units.duration(total_s),
            )
        else:
            self.session.failed += 1
            log.warning("req#%d failed: %s: %s", record.number, record.protocol, message)
        if self.request_log is None:
            return
        out = self.base("request_error")
        out.update(
            request_id=record.number,
            http_request_id=record.http_request_id,
            protocol=record.protocol,
            error={"kind": kind, "message": message},
            prompt_tokens=record.prompt_tokens,
            completion_tokens=len(record.generated_token_ids),
            timings_seconds={
                "prepare": record.submitted - record.received,
                "ttft": (record.first_token - record.received) if record.first_token else None,
                "total": total_s,
            },
            generated_token_ids=list(record.generated_token_ids),
        )
        self.write(out)

    def _changed(self) -> None:
        for callback in self.on_change:
            callback()


_TERMINAL_EVENTS = frozenset({"request_done", "request_error"})


def _route_path(path: str) -> str:
    return path[3:] if path.startswith("/v1/v1/") else path


def _cancelled(record: RequestRecord, disconnected: bool, stopping: bool) -> bool:
    """Ended without a final event because it was cancelled while it waited for a lane."""
    error = record.admission_error
    if isinstance(error, QueueTimeout):
        return False
    return disconnected or stopping or (error is not None and "cancelled" in str(error))


def _reuse_path(cached: int) -> str:
    """request_done.result.prefix_reuse_path: the hybrid cache resumed from its blocks (and,
    on a hybrid model, a state snapshot), or nothing was reused."""
    return "hybrid_snapshot" if cached else "root"


def _cache_summary(cached: int, prompt: int) -> str:
    """The console's `cache N (P%, path)`, with a readable path label."""
    if not cached:
        return "cache 0"
    return f"cache {cached} ({100 * cached // max(prompt, 1)}%, hybrid snapshot)"


def _stop_kind(final: EngineEvent) -> str | None:
    if final.finish_reason != "stop":
        return None
    if isinstance(final.stop_reason, str):
        return "stop_string"
    return "token"
