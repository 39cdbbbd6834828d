"""POST /v1/messages and /v1/messages/count_tokens: lowering, admission, aggregate or SSE.

A stream opens once the engine accepted the request and waits for its lane with `ping`
events; `message_start` (with the exact prompt usage) follows admission. A failure after
that is one `error` event, then the stream closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec

from ninfer.engine_types import EngineEvent
from ninfer.protocols.anthropic_messages.lowering import (
    LoweredMessages,
    lower_messages_request,
    messages_conversation,
    render_messages,
)
from ninfer.protocols.anthropic_messages.protocol import decode_request
from ninfer.protocols.anthropic_messages.render import BlockStream, Event, MessageRenderer
from ninfer.protocols.constraints import attach_constraint, turn_observation
from ninfer.protocols.served_model import ServedModel
from ninfer.protocols.turn import TurnDecoder, TurnResult, TurnUsage
from ninfer.server.anthropic_errors import anthropic_error
from ninfer.server.config import AppConfig
from ninfer.server.disconnect import DisconnectWatcher
from ninfer.server.errors import ApiError, from_decode_error
from ninfer.server.generation import (
    log_turn_done,
    no_final_event,
    raise_if_failed,
    report_turn,
    run_generation,
    stream_failure,
    wait_for_lane,
)
from ninfer.server.http import HttpRequest
from ninfer.server.inflight import InflightRequests
from ninfer.server.sse import SseStream, await_with_heartbeat, with_heartbeat

log = logging.getLogger("ninfer.server")


class TokenCountGate:
    """How many count_tokens requests may prepare at once; beyond it they are overloaded."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.active = 0

    @contextlib.contextmanager
    def admit(self):  # noqa: ANN201
        if self.active >= self.capacity:
            raise ApiError(
                429,
                f"all {self.capacity} token-count slots are in use; retry later",
                code="server_overloaded",
            )
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


def _decode(body: bytes) -> Any:
    try:
        return decode_request(body)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None


async def count_tokens(
    request: HttpRequest, served: ServedModel, config: AppConfig, gate: TokenCountGate
) -> None:
    body = await request.read_body(config.max_request_bytes)
    parsed = _decode(body)
    with gate.admit():
        # Rendering and encoding a long agent prompt is CPU work: keep it off the loop.
        prompt = await asyncio.to_thread(
            lambda: render_messages(served, messages_conversation(parsed))
        )
    await request.send_json(200, {"input_tokens": len(prompt.ids)})


async def messages(
    request: HttpRequest, served: ServedModel, config: AppConfig, inflight: InflightRequests
) -> None:
    inflight.check_open()
    body = await request.read_body(config.max_request_bytes)
    lowered = lower_messages_request(_decode(body), served)
    lowered.constraint = await attach_constraint(
        served.engine, lowered.constraint, lowered.generation
    )
    started = time.perf_counter()
    renderer = MessageRenderer(lowered)
    results: list[TurnResult] = []

    async def respond(handle: Any, watcher: DisconnectWatcher) -> EngineEvent | None:
        if lowered.stream:
            return await _stream(request, handle, renderer, watcher, config, results)
        return await _aggregate(request, handle, renderer, watcher, results)

    final, disconnected = await run_generation(
        request, served, inflight, lowered.generation, respond
    )
    log_turn_done(
        request,
        "messages",
        results[0] if results else None,
        final,
        disconnected,
        started,
        lowered.stream,
        _budget_detail(lowered),
    )


async def _aggregate(
    request: HttpRequest,
    handle: Any,
    renderer: MessageRenderer,
    watcher: DisconnectWatcher,
    results: list[TurnResult],
) -> EngineEvent | None:
    lowered = renderer.lowered
    await wait_for_lane(handle, watcher)
    turn = TurnDecoder(lowered.prompt.decoder, lowered.prompt_tokens)
    async for event in handle:
        turn.feed(event)
        if event.finished:
            if watcher.disconnected.is_set():
                return event
            raise_if_failed(event)
            _, result = turn.finish(event)
            results.append(result)
            report_turn(handle, result, turn_observation(lowered.constraint, result))
            await request.send_json(200, renderer.aggregate(result))
            return event
    raise no_final_event()


async def _stream(
    request: HttpRequest,
    handle: Any,
    renderer: MessageRenderer,
    watcher: DisconnectWatcher,
    config: AppConfig,
    results: list[TurnResult],
) -> EngineEvent | None:
    lowered = renderer.lowered
    sse = SseStream(request)
    await sse.open()

    async def ping() -> None:
        await sse.named_event("ping", {"type": "ping"})

    async def send(events: list[Event]) -> None:
        for name, payload in events:
            await sse.named_event(name, payload)

    try:
        await watcher.race(await_with_heartbeat(handle.admitted(), config.keep_alive_s, ping))
        turn = TurnDecoder(lowered.prompt.decoder, lowered.prompt_tokens)
        # Admission fixed the reused prefix: message_start already splits it out exactly.
        cached = getattr(handle, "cached_tokens", 0)
        await send(
            [renderer.message_start(TurnUsage(lowered.prompt_tokens, 0, cached_tokens=cached))]
        )
        blocks = BlockStream(renderer)
        events = with_heartbeat(handle, config.keep_alive_s, ping, sink=sse)
        async with contextlib.aclosing(events):
            async for event in events:
                if watcher.disconnected.is_set():
                    return event
                delta = turn.feed(event)
                await send(blocks.feed(delta, turn.reasoning_complete))
                if event.finished:
                    raise_if_failed(event)
                    tail, result = turn.finish(event)
                    results.append(result)
                    report_turn(handle, result, turn_observation(lowered.constraint, result))
                    await send(blocks.finish(tail, result) + renderer.message_end(result))
                    await sse.close()
                    return event
        raise no_final_event()
    except Exception as exc:
        await _fail_stream(request, sse, exc, watcher)
        return None


async def _fail_stream(
    request: HttpRequest, sse: SseStream, exc: Exception, watcher: DisconnectWatcher
) -> None:
    error = stream_failure(request, exc, watcher)
    if error is None:
        return
    _, body = anthropic_error(error, request.request_id)
    await sse.named_event("error", body)
    await sse.close()


def _budget_detail(lowered: LoweredMessages) -> str:
    budget = lowered.generation.thinking_budget
    return f"thinking budget {budget.limit if budget else '-'}"
