"""Running one GenerationRequest on the engine for an HTTP request (every generation route).

Submission, admission, disconnect-driven cancellation, the in-flight registry and the
failure mapping of a stream that has already started are the same for Chat Completions and
/v1/completions (and the later Responses and Anthropic adapters); each route only supplies
how it answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ninfer.engine_types import EngineEvent, GenerationRequest
from ninfer.protocols.served_model import ServedModel
from ninfer.server.disconnect import DisconnectWatcher
from ninfer.server.errors import ApiError, from_engine_error
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
        if telemetry is not None:
            seed = getattr(handle, "seed", None)
            if seed is None:  # the engine did not say: the request's own, if any
                seed = generation.sampling.seed
            record = telemetry.start(request, generation, shape, seed)
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


def report_turn(handle: Any, turn: Any) -> None:
    """A protocol's decoded turn, for the request's done record (tool-call diagnostics)."""
    if isinstance(handle, ObservedHandle):
        handle.record.turn = turn


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


def raise_if_failed(event: EngineEvent) -> None:
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
    error = from_engine_error(exc) or (exc if isinstance(exc, ApiError) else None)
    if error is None:
        log.exception("%s: stream failed", request.request_id)
        error = ApiError(500, "internal error while streaming", code="internal_error")
    return error


async def fail_stream(
    request: HttpRequest, sse: SseStream, exc: Exception, watcher: DisconnectWatcher
) -> None:
    """A failure after the stream started: one error event (unless the client left)."""
    error = stream_failure(request, exc, watcher)
    if error is not None:
        await sse.fail(error.body())
