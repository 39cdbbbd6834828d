"""POST /v1/completions: a raw prompt (text or token ids), answered as plain text."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import msgspec

from ninfer.engine_types import EngineEvent
from ninfer.outputs import IncrementalTextDecoder
from ninfer.protocols.openai_chat.render import llama_timings
from ninfer.protocols.openai_completions.protocol import (
    LoweredCompletion,
    decode_completion_request,
    lower_completion_request,
)
from ninfer.protocols.openai_completions.render import CompletionRenderer, completion_usage
from ninfer.protocols.served_model import ServedModel
from ninfer.server.config import AppConfig
from ninfer.server.disconnect import DisconnectWatcher
from ninfer.server.errors import from_decode_error
from ninfer.server.generation import (
    fail_stream,
    no_final_event,
    raise_if_failed,
    run_generation,
    wait_for_lane,
    wait_for_lane_streaming,
)
from ninfer.server.http import HttpRequest
from ninfer.server.inflight import InflightRequests
from ninfer.server.sse import SseStream, with_heartbeat

log = logging.getLogger("ninfer.server")
_FINISH = {"stop": "stop", "length": "length"}


async def completions(
    request: HttpRequest, served: ServedModel, config: AppConfig, inflight: InflightRequests
) -> None:
    inflight.check_open()
    body = await request.read_body(config.max_request_bytes)
    try:
        parsed = decode_completion_request(body)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None
    lowered = lower_completion_request(parsed, served)
    renderer = CompletionRenderer(served.public_id)

    async def respond(handle: Any, watcher: DisconnectWatcher) -> EngineEvent | None:
        if lowered.stream:
            return await _stream(request, handle, renderer, lowered, watcher, config)
        return await _aggregate(request, handle, renderer, lowered, watcher)

    final, disconnected = await run_generation(
        request, served, inflight, lowered.generation, respond, shape={"stream": lowered.stream}
    )
    if final is not None and not disconnected:
        log.debug(  # the request's info record is the telemetry's req#N line
            "%s completion done: prompt %d, completion %d, finish %s",
            request.request_id,
            lowered.prompt_tokens,
            final.completion_tokens,
            final.finish_reason,
        )


def _usage_and_timings(lowered: LoweredCompletion, event: EngineEvent) -> tuple[dict, dict]:
    prompt = event.prompt_tokens or lowered.prompt_tokens
    return (
        completion_usage(prompt, event.completion_tokens),
        llama_timings(event.timings, prompt, event.completion_tokens, event.cached_tokens),
    )


async def _aggregate(
    request: HttpRequest,
    handle: Any,
    renderer: CompletionRenderer,
    lowered: LoweredCompletion,
    watcher: DisconnectWatcher,
) -> EngineEvent | None:
    await wait_for_lane(handle, watcher)
    decoder = IncrementalTextDecoder()
    pieces: list[str] = []
    token_ids: list[int] = []
    async for event in handle:
        pieces.append(decoder.feed(event.text))
        token_ids += event.token_ids
        if event.finished:
            pieces.append(decoder.flush())
            if watcher.disconnected.is_set():
                return event
            raise_if_failed(event)
            usage, timings = _usage_and_timings(lowered, event)
            body = renderer.aggregate(
                "".join(pieces), _FINISH.get(event.finish_reason or "", "stop"), usage, timings
            )
            if lowered.return_token_ids:
                body["choices"][0]["prompt_token_ids"] = lowered.generation.prompt_ids
                body["choices"][0]["token_ids"] = token_ids
            await request.send_json(200, body)
            return event
    raise no_final_event()


async def _stream(
    request: HttpRequest,
    handle: Any,
    renderer: CompletionRenderer,
    lowered: LoweredCompletion,
    watcher: DisconnectWatcher,
    config: AppConfig,
) -> EngineEvent | None:
    sse = SseStream(request)
    await sse.open()
    decoder = IncrementalTextDecoder()
    first = True
    try:
        await wait_for_lane_streaming(handle, watcher, sse, config.keep_alive_s)
        events = with_heartbeat(handle, config.keep_alive_s, sse.keep_alive, sink=sse)
        async with contextlib.aclosing(events):
            async for event in events:
                if watcher.disconnected.is_set():
                    return event
                text = decoder.feed(event.text) + (decoder.flush() if event.finished else "")
                if text or event.token_ids and lowered.return_token_ids:
                    chunk = renderer.chunk(text)
                    if lowered.return_token_ids:
                        chunk["choices"][0]["token_ids"] = event.token_ids
                        if first:
                            chunk["choices"][0]["prompt_token_ids"] = lowered.generation.prompt_ids
                            first = False
                    await sse.event(chunk)
                if event.finished:
                    raise_if_failed(event)
                    usage, timings = _usage_and_timings(lowered, event)
                    last = renderer.chunk("", _FINISH.get(event.finish_reason or "", "stop"))
                    if lowered.return_token_ids and first:
                        last["choices"][0]["prompt_token_ids"] = lowered.generation.prompt_ids
                    if lowered.include_usage:
                        await sse.event(last)
                        last = renderer.usage_chunk(usage)
                    last["timings"] = timings
                    await sse.event(last)
                    await sse.finish()
                    return event
        raise no_final_event()
    except Exception as exc:
        await fail_stream(request, sse, exc, watcher)
        return None
