"""POST /v1/chat/completions: lowering, admission, and the aggregate or streamed answer."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import msgspec

from ninfer.engine_types import EngineEvent
from ninfer.outputs import IncrementalTextDecoder
from ninfer.protocols.openai_chat import render
from ninfer.protocols.openai_chat.lowering import LoweredChat, lower_chat_request
from ninfer.protocols.openai_chat.protocol import decode_request
from ninfer.protocols.openai_chat.render import ChatRenderer
from ninfer.protocols.served_model import ServedModel
from ninfer.server.config import AppConfig
from ninfer.server.disconnect import DisconnectWatcher
from ninfer.server.errors import ApiError, from_decode_error, from_engine_error
from ninfer.server.http import HttpRequest
from ninfer.server.inflight import InflightRequests, shutting_down
from ninfer.server.sse import SseStream, with_heartbeat

log = logging.getLogger("ninfer.server")


async def chat_completions(
    request: HttpRequest, served: ServedModel, config: AppConfig, inflight: InflightRequests
) -> None:
    inflight.check_open()
    body = await request.read_body(config.max_request_bytes)
    try:
        parsed = decode_request(body)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None
    lowered = lower_chat_request(parsed, served)
    started = time.perf_counter()
    watcher = DisconnectWatcher(request.receive)
    try:
        try:
            handle = served.engine.submit(lowered.generation)
        except ValueError as exc:  # the engine's verdict on this request's parameters
            raise ApiError(400, f"invalid request: {exc}", code="invalid_request") from exc
        watcher.on_disconnect(handle.cancel)
        inflight.add(handle)
        try:
            await watcher.race(handle.admitted())
            renderer = ChatRenderer(served.public_id)
            if lowered.stream:
                final = await _stream(request, handle, renderer, lowered, watcher, config)
            else:
                final = await _aggregate(request, handle, renderer, lowered, watcher)
        finally:
            inflight.discard(handle)
            handle.cancel()  # idempotent; frees the lane on every early exit
    finally:
        watcher.stop()
    _log_done(request, lowered, final, watcher.disconnected.is_set(), started)


async def _aggregate(
    request: HttpRequest,
    handle: Any,
    renderer: ChatRenderer,
    lowered: LoweredChat,
    watcher: DisconnectWatcher,
) -> EngineEvent | None:
    decoder = IncrementalTextDecoder()
    pieces: list[str] = []
    async for event in handle:
        pieces.append(decoder.feed(event.text))
        if event.finished:
            pieces.append(decoder.flush())
            if watcher.disconnected.is_set():
                return event
            _raise_if_failed(event)
            prompt_tokens = event.prompt_tokens or lowered.prompt_tokens
            await request.send_json(
                200,
                renderer.aggregate(
                    "".join(pieces),
                    render.finish_reason(event.finish_reason),
                    render.usage(prompt_tokens, event.completion_tokens),
                    render.llama_timings(event.timings, prompt_tokens, event.completion_tokens),
                ),
            )
            return event
    raise ApiError(500, "the engine ended the request without a final event", code="engine_error")


async def _stream(
    request: HttpRequest,
    handle: Any,
    renderer: ChatRenderer,
    lowered: LoweredChat,
    watcher: DisconnectWatcher,
    config: AppConfig,
) -> EngineEvent | None:
    sse = SseStream(request)
    await sse.open()
    try:
        await sse.event(renderer.role_chunk())
        decoder = IncrementalTextDecoder()
        events = with_heartbeat(handle, config.keep_alive_s, sse.keep_alive)
        async with contextlib.aclosing(events):
            async for event in events:
                if watcher.disconnected.is_set():
                    return event
                text = decoder.feed(event.text) + (decoder.flush() if event.finished else "")
                if text:
                    await sse.event(renderer.content_chunk(text))
                if event.finished:
                    _raise_if_failed(event)
                    await _send_stream_end(sse, renderer, lowered, event, config.usage_chunk_choice)
                    return event
        raise ApiError(
            500, "the engine ended the request without a final event", code="engine_error"
        )
    except Exception as exc:
        if watcher.disconnected.is_set():
            return None
        error = from_engine_error(exc) or (exc if isinstance(exc, ApiError) else None)
        if error is None:
            log.exception("%s: stream failed", request.request_id)
            error = ApiError(500, "internal error while streaming", code="internal_error")
        await sse.fail(error.body())
        return None


async def _send_stream_end(
    sse: SseStream,
    renderer: ChatRenderer,
    lowered: LoweredChat,
    event: EngineEvent,
    usage_chunk_choice: bool,
) -> None:
    prompt_tokens = event.prompt_tokens or lowered.prompt_tokens
    timings = render.llama_timings(event.timings, prompt_tokens, event.completion_tokens)
    finish = renderer.finish_chunk(render.finish_reason(event.finish_reason))
    if lowered.include_usage:
        await sse.event(finish)
        last = renderer.usage_chunk(
            render.usage(prompt_tokens, event.completion_tokens), with_choice=usage_chunk_choice
        )
    else:
        last = finish
    last["timings"] = timings  # llama.cpp puts timings on the last JSON chunk
    await sse.event(last)
    await sse.finish()


def _raise_if_failed(event: EngineEvent) -> None:
    if event.finish_reason == "error":
        raise ApiError(
            500, f"generation failed: {event.error or 'engine error'}", code="engine_error"
        )
    if event.finish_reason == "cancelled":
        raise shutting_down()  # cancelled by the server itself: only a stop does that


def _log_done(
    request: HttpRequest,
    lowered: LoweredChat,
    final: EngineEvent | None,
    disconnected: bool,
    started: float,
) -> None:
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    if final is None or disconnected:
        outcome = "client disconnected" if disconnected else "failed"
        log.info("%s chat %s after %.0f ms", request.request_id, outcome, elapsed_ms)
        return
    log.info(
        "%s chat done: prompt %d, completion %d, finish %s, %s, %.0f ms",
        request.request_id,
        lowered.prompt_tokens,
        final.completion_tokens,
        final.finish_reason,
        "stream" if lowered.stream else "aggregate",
        elapsed_ms,
    )
