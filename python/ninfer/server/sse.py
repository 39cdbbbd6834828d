"""Server-sent events framing, with a keep-alive comment while the engine is quiet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ninfer.server.http import HttpRequest, encode_json

T = TypeVar("T")

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class SseStream:
    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self.closed = False

    async def open(self) -> None:
        await self._request.start_response(200, list(_SSE_HEADERS))

    async def event(self, payload: dict[str, Any]) -> None:
        await self._request.send_body(b"data: " + encode_json(payload) + b"\n\n", more=True)

    async def named_event(self, name: str, payload: dict[str, Any]) -> None:
        """An event with an `event:` name line (Anthropic's framing)."""
        frame = b"event: " + name.encode() + b"\ndata: " + encode_json(payload) + b"\n\n"
        await self._request.send_body(frame, more=True)

    async def keep_alive(self) -> None:
        await self._request.send_body(b": keep-alive\n\n", more=True)

    async def finish(self) -> None:
        """The normal end: `[DONE]` and the close in one send (one fewer hand-off to the
        HTTP server's writer thread per request)."""
        if not self.closed:
            self.closed = True
            await self._request.send_body(b"data: [DONE]\n\n")

    async def fail(self, error_body: dict[str, Any]) -> None:
        """A failure after the stream started: one error event, no `[DONE]`."""
        await self.event(error_body)
        await self.close()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._request.send_body(b"")


async def with_heartbeat(
    items: AsyncIterable[T], interval: float, beat: Callable[[], Awaitable[None]]
) -> AsyncIterator[T]:
    """Yield from `items`, awaiting `beat()` after every `interval` seconds of silence.

    The pending `__anext__` is never cancelled by a beat, so no item is lost. An iterator
    with `next_within(timeout)` (the engine's RequestHandle: the next item, or None after
    `timeout` seconds) is read through it, which costs no Task and no `asyncio.wait` per
    item: at hundreds of tokens a second per stream, those were most of the loop's work.
    """
    iterator = items.__aiter__()
    next_within = getattr(iterator, "next_within", None)
    while next_within is not None:
        try:
            item = await next_within(interval)
        except StopAsyncIteration:
            return
        if item is None:
            await beat()
        else:
            yield item
    while True:
        pending = asyncio.ensure_future(iterator.__anext__())
        try:
            while not (await asyncio.wait({pending}, timeout=interval))[0]:
                await beat()
        except BaseException:
            pending.cancel()
            raise
        try:
            item = pending.result()
        except StopAsyncIteration:
            return
        yield item


async def await_with_heartbeat(
    awaitable: Awaitable[T], interval: float, beat: Callable[[], Awaitable[None]]
) -> T:
    """Await `awaitable`, awaiting `beat()` after every `interval` seconds it is not done."""
    pending = asyncio.ensure_future(awaitable)
    try:
        while not (await asyncio.wait({pending}, timeout=interval))[0]:
            await beat()
    except BaseException:
        pending.cancel()
        raise
    return pending.result()
