"""The /v1/responses routes: create (aggregate or semantic SSE), the stored-Response
resources, input-token counting, and the explicit refusals (cancel, compact)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from ninfer.engine_types import EngineEvent
from ninfer.outputs.channels import ChannelDelta
from ninfer.protocols.constraints import attach_constraint, turn_observation
from ninfer.protocols.openai_responses.items import compaction_not_supported
from ninfer.protocols.openai_responses.lowering import lower_create, prepare_prompt
from ninfer.protocols.openai_responses.protocol import decode_create, decode_input_tokens
from ninfer.protocols.openai_responses.render import OutputStream, ResponseBuilder
from ninfer.protocols.openai_responses.store import (
    ResponseStore,
    StoredResponse,
    response_not_found,
)
from ninfer.protocols.served_model import ServedModel
from ninfer.protocols.turn import TurnDecoder, TurnResult
from ninfer.server.config import AppConfig
from ninfer.server.disconnect import DisconnectWatcher
from ninfer.server.errors import ApiError, invalid, unsupported
from ninfer.server.generation import (
    log_turn_done,
    no_final_event,
    raise_if_failed,
    report_turn,
    run_generation,
    stream_failure,
    wait_for_lane,
    wait_for_lane_streaming,
)
from ninfer.server.http import HttpRequest, encode_json
from ninfer.server.inflight import InflightRequests
from ninfer.server.sse import SseStream, with_heartbeat

log = logging.getLogger("ninfer.server")


class _EventStream(SseStream):
    """Responses SSE: every frame names its event, equal to the payload's `type`."""

    async def typed(self, payload: dict[str, Any]) -> None:
        frame = b"event: " + payload["type"].encode() + b"\ndata: " + encode_json(payload)
        await self._frame(frame + b"\n\n")


async def create_response(
    request: HttpRequest,
    served: ServedModel,
    config: AppConfig,
    inflight: InflightRequests,
    store: ResponseStore,
) -> None:
    inflight.check_open()
    body = await request.read_body(config.max_request_bytes)
    lowered = lower_create(decode_create(body), served, store, request.request_id)
    lowered.constraint = await attach_constraint(
        served.engine, lowered.constraint, lowered.generation
    )
    started = time.perf_counter()
    builder = ResponseBuilder(lowered, served.public_id)
    results: list[TurnResult] = []

    async def respond(handle: Any, watcher: DisconnectWatcher) -> EngineEvent | None:
        if lowered.stream:
            return await _stream(request, handle, builder, watcher, config, store, results)
        return await _aggregate(request, handle, builder, watcher, store, results)

    shape = {
        "stream": lowered.stream,
        "items": len(lowered.prepared.history) + len(lowered.prepared.input_items),
        "tools": len(lowered.prepared.tools.definitions),
        "store": lowered.store,
    }
    final, disconnected = await run_generation(
        request, served, inflight, lowered.generation, respond, shape=shape
    )
    log_turn_done(
        request,
        "responses",
        results[0] if results else None,
        final,
        disconnected,
        started,
        lowered.stream,
        f"effort {lowered.prompt.options.requested_effort or '-'}, "
        f"store {'on' if lowered.store else 'off'}",
    )


def _store_result(store: ResponseStore, builder: ResponseBuilder, response: dict[str, Any]) -> None:
    lowered = builder.lowered
    if not lowered.store:
        return
    prepared = lowered.prepared
    store.put(
        StoredResponse(
            id=builder.id,
            response=response,
            input_items=prepared.input_items,
            history=[*prepared.history, *prepared.input_items, *response["output"]],
            preserve_thinking=prepared.preserve_thinking,
        )
    )


async def _aggregate(
    request: HttpRequest,
    handle: Any,
    builder: ResponseBuilder,
    watcher: DisconnectWatcher,
    store: ResponseStore,
    results: list[TurnResult],
) -> EngineEvent | None:
    lowered = builder.lowered
    await wait_for_lane(handle, watcher)
    turn = TurnDecoder(lowered.prompt.decoder, lowered.prompt_tokens)
    async for event in handle:
        turn.feed(event)
        if not event.finished:
            continue
        if watcher.disconnected.is_set():
            return event
        raise_if_failed(event)
        _, result = turn.finish(event)
        results.append(result)
        report_turn(handle, result, turn_observation(lowered.constraint, result))
        output = OutputStream(lowered, lowered.prepared.tools)
        output.reasoning(result.reasoning)
        output.close_reasoning()
        output.content(result.content)
        status = output.finish(result)
        response = _terminal(builder, status, output, result)
        _store_result(store, builder, response)
        await request.send_json(200, response)
        return event
    raise no_final_event()


async def _stream(
    request: HttpRequest,
    handle: Any,
    builder: ResponseBuilder,
    watcher: DisconnectWatcher,
    config: AppConfig,
    store: ResponseStore,
    results: list[TurnResult],
) -> EngineEvent | None:
    lowered = builder.lowered
    sse = _EventStream(request)
    output = OutputStream(lowered, lowered.prepared.tools)
    await sse.open()
    try:
        output.emit("response.created", response=builder.response("in_progress", []))
        output.emit("response.in_progress", response=builder.response("in_progress", []))
        await _flush(sse, output)
        await wait_for_lane_streaming(handle, watcher, sse, config.keep_alive_s)
        turn = TurnDecoder(lowered.prompt.decoder, lowered.prompt_tokens)
        events = with_heartbeat(handle, config.keep_alive_s, sse.keep_alive, sink=sse)
        async with contextlib.aclosing(events):
            async for event in events:
                if watcher.disconnected.is_set():
                    return event
                _apply(output, turn, turn.feed(event))
                if event.finished:
                    raise_if_failed(event)
                    tail, result = turn.finish(event)
                    results.append(result)
                    report_turn(handle, result, turn_observation(lowered.constraint, result))
                    _apply(output, turn, tail)
                    status = output.finish(result)
                    response = _terminal(builder, status, output, result)
                    _store_result(store, builder, response)
                    output.emit(f"response.{status}", response=response)
                    await _flush(sse, output)
                    await sse.close()
                    return event
                await _flush(sse, output)
        raise no_final_event()
    except Exception as exc:
        await _fail_stream(request, sse, output, builder, exc, watcher)
        return None


def _terminal(
    builder: ResponseBuilder, status: str, output: OutputStream, result: TurnResult
) -> dict[str, Any]:
    """The terminal Response object; a constrained one carries the constraint observation."""
    response = builder.response(status, output.items, result.usage)
    observed = turn_observation(builder.lowered.constraint, result)
    if observed is not None:
        response["constraint"] = observed
    return response


def _apply(output: OutputStream, turn: TurnDecoder, delta: ChannelDelta) -> None:
    output.reasoning(delta.reasoning)
    if turn.reasoning_complete or delta.content:
        output.close_reasoning()
    output.content(delta.content)


async def _flush(sse: _EventStream, output: OutputStream) -> None:
    for event in output.take_events():
        await sse.typed(event)


async def _fail_stream(
    request: HttpRequest,
    sse: _EventStream,
    output: OutputStream,
    builder: ResponseBuilder,
    exc: Exception,
    watcher: DisconnectWatcher,
) -> None:
    """A failure after the stream started ends it with response.failed (no output kept)."""
    if sse.closed:
        return
    error = stream_failure(request, exc, watcher)
    if error is None:
        return
    output.take_events()  # whatever was pending belongs to the failed attempt
    failed = builder.response("failed", [], error={"code": error.code, "message": error.message})
    output.emit("response.failed", response=failed)
    with contextlib.suppress(Exception):
        await _flush(sse, output)
    await sse.close()


# ---- stored Responses ------------------------------------------------------------------


def _query(request: HttpRequest) -> dict[str, list[str]]:
    raw = request.scope.get("query_string", b"")
    return parse_qs(raw.decode("latin-1"), keep_blank_values=True)


def _stored(store: ResponseStore, response_id: str) -> StoredResponse:
    record = store.get(response_id)
    if record is None:
        raise response_not_found(response_id)
    return record


async def retrieve_response(request: HttpRequest, store: ResponseStore, response_id: str) -> None:
    query = _query(request)
    if any(v.lower() not in ("", "false") for v in query.get("stream", [])):
        raise unsupported("stream", "a stored Response cannot be streamed again")
    for key in ("include", "include[]"):
        if any(query.get(key, [])):
            raise unsupported(key, "a stored Response is returned as it was stored")
    await request.send_json(200, _stored(store, response_id).response)


async def delete_response(request: HttpRequest, store: ResponseStore, response_id: str) -> None:
    if not store.delete(response_id):
        raise response_not_found(response_id)
    await request.send_json(200, {"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: HttpRequest, store: ResponseStore, response_id: str) -> None:
    query = _query(request)
    record = _stored(store, response_id)
    limit_text = (query.get("limit") or ["20"])[-1]
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= 100:
        raise invalid("`limit` must be an integer from 1 to 100", "limit")
    order = (query.get("order") or ["desc"])[-1]
    if order not in ("asc", "desc"):
        raise invalid("`order` must be `asc` or `desc`", "order")
    for key in ("include", "include[]"):
        if any(query.get(key, [])):
            raise unsupported(key, "input Items are listed as they were received")
    items = list(record.input_items)
    if order == "desc":
        items.reverse()
    after = (query.get("after") or [None])[-1]
    if after:
        position = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if position is None:
            raise invalid(f"`after` names no input Item of {response_id}", "after")
        items = items[position + 1 :]
    page = items[: int(limit_text)]
    await request.send_json(
        200,
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page),
        },
    )


async def cancel_response(request: HttpRequest, store: ResponseStore, response_id: str) -> None:
    _stored(store, response_id)
    raise ApiError(
        400,
        "only background Responses can be cancelled, and this server runs no background "
        "Responses (every Response it stores is already finished)",
        code="background_not_supported",
    )


async def compact_response(request: HttpRequest, config: AppConfig) -> None:
    await request.read_body(config.max_request_bytes)
    raise compaction_not_supported()


async def count_input_tokens(
    request: HttpRequest, served: ServedModel, config: AppConfig, store: ResponseStore
) -> None:
    body = await request.read_body(config.max_request_bytes)
    prepared = prepare_prompt(decode_input_tokens(body), served, store, request.request_id)
    await request.send_json(
        200, {"object": "response.input_tokens", "input_tokens": len(prepared.prompt.ids)}
    )
