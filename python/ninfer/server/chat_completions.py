"""POST /v1/chat/completions: lowering, admission, and the aggregate or streamed answer."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import msgspec

from ninfer.engine_types import EngineEvent
from ninfer.outputs.channels import ChannelDelta
from ninfer.protocols.constraints import attach_constraint, turn_observation
from ninfer.protocols.openai_chat import render
from ninfer.protocols.openai_chat.lowering import LoweredChat, lower_chat_request
from ninfer.protocols.openai_chat.protocol import decode_request
from ninfer.protocols.openai_chat.render import ChatRenderer
from ninfer.protocols.served_model import ServedModel
from ninfer.protocols.turn import TurnDecoder, TurnResult
from ninfer.server.config import AppConfig
from ninfer.server.disconnect import DisconnectWatcher
from ninfer.server.errors import from_decode_error
from ninfer.server.generation import (
    fail_stream,
    log_turn_done,
    no_final_event,
    raise_if_failed,
    report_turn,
    run_generation,
    wait_for_lane,
    wait_for_lane_streaming,
)
from ninfer.server.http import HttpRequest
from ninfer.server.inflight import InflightRequests
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
    lowered.constraint = await attach_constraint(
        served.engine, lowered.constraint, lowered.generation
    )
    started = time.perf_counter()
    renderer = ChatRenderer(served.public_id)
    results: list[TurnResult] = []

    async def respond(handle: Any, watcher: DisconnectWatcher) -> EngineEvent | None:
        if lowered.stream:
            return await _stream(request, handle, renderer, lowered, watcher, config, results)
        return await _aggregate(request, handle, renderer, lowered, watcher, results)

    shape = {
        "stream": lowered.stream,
        "messages": len(parsed.messages),
        "tools": len(lowered.tools or ()),
    }
    final, disconnected = await run_generation(
        request, served, inflight, lowered.generation, respond, shape=shape
    )
    log_turn_done(
        request,
        "chat",
        results[0] if results else None,
        final,
        disconnected,
        started,
        lowered.stream,
        f"effort {lowered.prompt.options.requested_effort or '-'}",
    )


async def _aggregate(
    request: HttpRequest,
    handle: Any,
    renderer: ChatRenderer,
    lowered: LoweredChat,
    watcher: DisconnectWatcher,
    results: list[TurnResult],
) -> EngineEvent | None:
    await wait_for_lane(handle, watcher)
    turn = TurnDecoder(lowered.prompt.decoder, lowered.prompt_tokens)  # its clock starts now
    async for event in handle:
        turn.feed(event)
        if event.finished:
            if watcher.disconnected.is_set():
                return event
            raise_if_failed(event)
            _, result = turn.finish(event)
            results.append(result)
            report_turn(handle, result, turn_observation(lowered.constraint, result))
            timings = render.llama_timings(
                result.timings,
                result.usage.prompt_tokens,
                result.usage.completion_tokens,
                result.usage.cached_tokens,
            )
            prompt_ids = lowered.generation.prompt_ids if lowered.return_token_ids else None
            body = renderer.aggregate(result, lowered.tools, timings, prompt_ids)
            _observe_constraint(body, lowered, result)
            await request.send_json(200, body)
            return event
    raise no_final_event()


async def _stream(
    request: HttpRequest,
    handle: Any,
    renderer: ChatRenderer,
    lowered: LoweredChat,
    watcher: DisconnectWatcher,
    config: AppConfig,
    results: list[TurnResult],
) -> EngineEvent | None:
    sse = SseStream(request)
    await sse.open()
    total = lowered.prompt_tokens
    try:
        await wait_for_lane_streaming(handle, watcher, sse, config.keep_alive_s)
        turn = TurnDecoder(lowered.prompt.decoder, lowered.prompt_tokens)  # its clock starts now
        turn.cached_tokens = getattr(handle, "cached_tokens", 0)
        first = renderer.role_chunk()
        if lowered.return_token_ids:
            first["prompt_token_ids"] = lowered.generation.prompt_ids
        await sse.event(first)
        if lowered.return_progress:
            await sse.event(renderer.progress_chunk(_progress(total, turn.cached_tokens, turn)))
        prompt_done = False
        events = with_heartbeat(handle, config.keep_alive_s, sse.keep_alive, sink=sse)
        async with contextlib.aclosing(events):
            async for event in events:
                if watcher.disconnected.is_set():
                    return event
                if event.prompt_processed is not None:  # a committed prefill chunk
                    if lowered.return_progress and not prompt_done:
                        processed = max(turn.cached_tokens, min(event.prompt_processed, total))
                        await sse.event(renderer.progress_chunk(_progress(total, processed, turn)))
                    continue
                delta = turn.feed(event)
                if (
                    lowered.return_progress
                    and not prompt_done
                    and (event.token_ids or event.finished)
                ):
                    prompt_done = True
                    await sse.event(renderer.progress_chunk(_progress(total, total, turn)))
                await _send_delta(sse, renderer, lowered, turn, delta)
                if event.finished:
                    raise_if_failed(event)
                    tail, result = turn.finish(event)
                    results.append(result)
                    report_turn(handle, result, turn_observation(lowered.constraint, result))
                    await _send_delta(sse, renderer, lowered, turn, tail)
                    await _send_stream_end(
                        sse, renderer, lowered, result, config.usage_chunk_choice
                    )
                    return event
        raise no_final_event()
    except Exception as exc:
        await fail_stream(request, sse, exc, watcher)
        return None


def _progress(total: int, processed: int, turn: TurnDecoder) -> dict[str, Any]:
    """One prompt_progress observation: `processed` counts the reused prefix, so the first
    event has processed == cache and the last processed == total."""
    elapsed = (time.perf_counter() - turn.clock.admitted) * 1000.0
    return {
        "total": total,
        "cache": turn.cached_tokens,
        "processed": processed,
        "time_ms": round(elapsed),
    }


async def _send_delta(
    sse: SseStream,
    renderer: ChatRenderer,
    lowered: LoweredChat,
    turn: TurnDecoder,
    delta: ChannelDelta,
) -> None:
    chunks = []
    if delta.reasoning:
        chunks.append(renderer.reasoning_chunk(delta.reasoning))
    if delta.content:
        chunks.append(renderer.content_chunk(delta.content))
    for chunk in chunks:
        if lowered.timings_per_token:
            chunk["timings"] = render.llama_timings(
                turn.clock.snapshot(),
                lowered.prompt_tokens,
                turn.clock.committed,
                turn.cached_tokens,
            )
        await sse.event(chunk)


async def _send_stream_end(
    sse: SseStream,
    renderer: ChatRenderer,
    lowered: LoweredChat,
    result: TurnResult,
    usage_chunk_choice: bool,
) -> None:
    if result.tool_calls:
        await sse.event(
            renderer.tool_calls_chunk(render.tool_calls(result.tool_calls, lowered.tools))
        )
    timings = render.llama_timings(
        result.timings,
        result.usage.prompt_tokens,
        result.usage.completion_tokens,
        result.usage.cached_tokens,
    )
    finish = renderer.finish_chunk(result.finish_reason)
    if lowered.return_token_ids:
        finish["choices"][0]["token_ids"] = result.token_ids
    if lowered.include_usage:
        await sse.event(finish)
        last = renderer.usage_chunk(render.usage(result.usage), with_choice=usage_chunk_choice)
    else:
        last = finish
    last["timings"] = timings  # llama.cpp puts timings on the last JSON chunk
    _observe_constraint(last, lowered, result)
    await sse.event(last)
    await sse.finish()


def _observe_constraint(body: dict[str, Any], lowered: LoweredChat, result: TurnResult) -> None:
    """The constraint observation, once per response (aggregate body or last chunk)."""
    observed = turn_observation(lowered.constraint, result)
    if observed is not None:
        body["constraint"] = observed
