"""Running one GenerationRequest on the engine for an HTTP request (every generation route).

Submission, admission, disconnect-driven cancellation, the in-flight registry and the
failure mapping of a stream that has already started are the same for Chat Completions and
/v1/completions (and the later Responses and Anthropic adapters); each route only supplies
how it answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ninfer.engine_types import EngineEvent, EngineUnavailable, GenerationRequest
from ninfer.protocols.served_model import ServedModel
from ninfer.server.disconnect import DisconnectWatcher
from ninfer.server.errors import ApiError, from_unhandled
from ninfer.server.http import HttpRequest
from ninfer.server.inflight import InflightRequests, shutting_down
from ninfer.server.sse import SseStream, await_with_heartbeat
from ninfer.server.telemetry import ObservedHandle

log = logging.getLogger("ninfer.server")

Respond = Callable[[Any, DisconnectWatcher], Awaitable[EngineEvent | None]]


async def run_generation(
    request: HttpRequest,
    served: ServedModel,
    inflight: InflightRequests,
    generation: GenerationRequest,
    respond: Respond,
    *,
    shape: dict[str, Any] | None = None,
) -> tuple[EngineEvent | None, bool]:
    """Submit, then `respond(handle, watcher)`, which waits for the lane itself (through
    `wait_for_lane` or `wait_for_lane_streaming`); returns its final event and whether the
    client disconnected. The request is reported to the server's telemetry (console record,
    request log, metrics) once it ends; `shape` adds protocol facts (stream, tool count) to
    its start record."""
    telemetry = inflight.telemetry
    watcher = DisconnectWatcher(request.receive)
    try:
        request.generation_phase = "submit"  # a refusal from here on is the engine's
        try:
            handle = served.engine.submit(generation)
        except ValueError as exc:  # the engine's verdict on this request's parameters
            raise ApiError(400, f"invalid request: {exc}", code="invalid_request") from exc
        handle = _ServedHandle(handle, inflight)
        if telemetry is not None:
            seed = getattr(handle, "seed", None)
            if seed is None:  # the engine did not say: the request's own, if any
                seed = generation.sampling.seed
            record = telemetry.start(
                request,
                generation,
                shape,
                seed,
                engine_request_id=getattr(handle, "request_id", None),
            )
            handle = ObservedHandle(handle, record, telemetry)
        watcher.on_disconnect(handle.cancel)
        final: EngineEvent | None = None
        try:
            inflight.add(handle)
            final = await respond(handle, watcher)
        finally:
            inflight.discard(handle)
            handle.cancel()  # idempotent; frees the lane on every early exit
            if isinstance(handle, ObservedHandle):
                telemetry.settle(
                    handle.record,
                    disconnected=watcher.disconnected.is_set(),
                    response_failed=final is None,
                    stopping=inflight.closing,
                )
    finally:
        watcher.stop()
    return final, watcher.disconnected.is_set()


class _ServedHandle:
    """The engine's request handle, except that a wait for a lane which the server's own stop
    cancelled says so ("the server is shutting down") instead of the engine's generic
    "request was cancelled"."""

    def __init__(self, handle: Any, inflight: InflightRequests) -> None:
        self._handle = handle
        self._inflight = inflight

    async def admitted(self) -> None:
        try:
            await self._handle.admitted()
        except EngineUnavailable:
            if self._inflight.closing:
                raise shutting_down() from None
            raise

    @property
    def cached_tokens(self) -> int:
        """The prefix cache's reuse, fixed at admission (0 before)."""
        return getattr(self._handle, "cached_tokens", 0)

    def cancel(self) -> None:
        self._handle.cancel()

    def __aiter__(self) -> Any:
        return self._handle.__aiter__()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def report_turn(handle: Any, turn: Any, constraint: dict[str, Any] | None = None) -> None:
    """A protocol's decoded turn, for the request's done record (tool-call diagnostics), and
    the constraint observation its response carries (None when unconstrained)."""
    if isinstance(handle, ObservedHandle):
        handle.record.turn = turn
        handle.record.constraint = constraint


async def wait_for_lane(handle: Any, watcher: DisconnectWatcher) -> None:
    """An aggregate answer waits for its lane silently: a queue timeout or a stop while
    waiting is still a plain HTTP error response."""
    await watcher.race(handle.admitted())


async def wait_for_lane_streaming(
    handle: Any, watcher: DisconnectWatcher, sse: SseStream, keep_alive_s: float
) -> None:
    """A stream sends its headers as soon as the engine accepted the request and then waits
    for its lane with `: keep-alive` comments: the connection carries data while queued, so
    a dead peer is detected by the retransmission limit (listener.py) and its place in the
    queue freed. Failures from here on (a queue timeout, a stop) are one error event."""
    await watcher.race(await_with_heartbeat(handle.admitted(), keep_alive_s, sse.keep_alive))


CONSTRAINT_DEAD_END = "constraint_dead_end"  # the core's error prefix for an empty mask
DEVICE_FAILURE = "device failure: "  # the core's error prefix after a fatal device error


def raise_if_failed(event: EngineEvent) -> None:
    if event.finish_reason == "error" and (event.error or "").startswith(CONSTRAINT_DEAD_END):
        # The request's own constraint allows no continuation of what was generated.
        raise ApiError(400, event.error or CONSTRAINT_DEAD_END, code=CONSTRAINT_DEAD_END)
    if event.finish_reason == "error" and (event.error or "").startswith(DEVICE_FAILURE):
        # The process exits next (a supervisor restarts it): like a stop, retry later. The
        # device error itself is in the server's log, not in answers.
        raise ApiError(
            503,
            "the server's device failed with an unrecoverable error and the server is exiting; "
            "retry once it has been restarted",
            code="service_unavailable",
        )
    if event.finish_reason == "error":
        raise ApiError(
            500, f"generation failed: {event.error or 'engine error'}", code="engine_error"
        )
    if event.finish_reason == "cancelled":
        raise shutting_down()  # cancelled by the server itself: only a stop does that


def no_final_event() -> ApiError:
    return ApiError(500, "the engine ended the request without a final event", code="engine_error")


def stream_failure(
    request: HttpRequest, exc: Exception, watcher: DisconnectWatcher
) -> ApiError | None:
    """The error a started stream reports for `exc`, or None when the client already left.
    Each protocol frames it in its own error event."""
    if watcher.disconnected.is_set():
        return None
    error = from_unhandled(exc) or (exc if isinstance(exc, ApiError) else None)
    if error is None:
        log.exception("%s: stream failed", request.request_id)
        error = ApiError(500, "internal error while streaming", code="internal_error")
    else:  # the same record an answer that had not started gets at the app boundary
        log.log(
            logging.INFO if error.status < 500 else logging.WARNING,
            "%s %s %s: stream ended with %d %s: %s",
            request.request_id,
            request.method,
            request.path,
            error.status,
            error.code,
            error.message,
        )
    return error


async def fail_stream(
    request: HttpRequest, sse: SseStream, exc: Exception, watcher: DisconnectWatcher
) -> None:
    """A failure after the stream started: one error event (unless the client left)."""
    error = stream_failure(request, exc, watcher)
    if error is not None:
        await sse.fail(error.body())


def log_turn_done(
    request: HttpRequest,
    protocol: str,
    result: Any,
    final: EngineEvent | None,
    disconnected: bool,
    started: float,
    stream: bool,
    details: str,
) -> None:
    """The debug line of a finished generation, for every protocol (the request's info
    record is the telemetry's req#N line); `details` is the protocol's own part."""
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    if final is None or result is None or disconnected:
        outcome = "client disconnected" if disconnected else "failed"
        log.debug("%s %s %s after %.0f ms", request.request_id, protocol, outcome, elapsed_ms)
        return
    report = result.report.as_dict() if result.report is not None else None
    usage = result.usage
    log.debug(
        "%s %s done: prompt %d (cache %d), completion %d (reasoning %d), finish %s, "
        "tool calls %d, %s, %s, %.0f ms%s",
        request.request_id,
        protocol,
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.completion_tokens,
        usage.reasoning_tokens,
        result.finish_reason,
        len(result.tool_calls),
        details,
        "stream" if stream else "aggregate",
        elapsed_ms,
        f", tool_call_parse {report}" if report else "",
    )
