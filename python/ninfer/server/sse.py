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
    """One response's event stream. While a stream loop holds it (`with_heartbeat(...,
    sink=stream)`), frames are kept and go out together just before the loop waits for the
    engine: a burst of ready events (a busy loop, speculative rounds committing several
    tokens) is one write instead of one per event. Each frame stays a whole SSE event; only
    how many events share one write changes."""

    # A held burst goes out at this size anyway, so a long one never delays the first bytes.
    MAX_HELD_FRAMES = 64
    MAX_HELD_BYTES = 1 << 16

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self.closed = False
        self._holding = False
        self._held: list[bytes] = []
        self._held_bytes = 0
        self.writes = 0  # body sends so far (tests and benchmarks read it)

    async def open(self) -> None:
        await self._request.start_response(200, list(_SSE_HEADERS))

    async def event(self, payload: dict[str, Any]) -> None:
        await self._frame(b"data: " + encode_json(payload) + b"\n\n")

    async def named_event(self, name: str, payload: dict[str, Any]) -> None:
        """An event with an `event:` name line (Anthropic's framing)."""
        await self._frame(b"event: " + name.encode() + b"\ndata: " + encode_json(payload) + b"\n\n")

    async def keep_alive(self) -> None:
        await self._send(b": keep-alive\n\n", more=True)

    async def finish(self) -> None:
        """The normal end: `[DONE]` and the close in one send (one fewer hand-off to the
        HTTP server's writer thread per request), with any held events before it."""
        if not self.closed:
            self.closed = True
            await self._send(b"data: [DONE]\n\n", more=False)

    async def fail(self, error_body: dict[str, Any]) -> None:
        """A failure after the stream started: one error event, no `[DONE]`."""
        await self.event(error_body)
        await self.close()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._send(b"", more=False)

    # --- holding (driven by with_heartbeat) ------------------------------------------------

    def hold(self) -> None:
        self._holding = True

    def release(self) -> None:
        """Stop holding; frames still held go out with the next send."""
        self._holding = False

    async def flush(self) -> None:
        if self._held and not self.closed:
            await self._send(b"", more=True)

    async def _frame(self, frame: bytes) -> None:
        if not self._holding:
            await self._send(frame, more=True)
            return
        self._held.append(frame)
        self._held_bytes += len(frame)
        if len(self._held) >= self.MAX_HELD_FRAMES or self._held_bytes >= self.MAX_HELD_BYTES:
            await self.flush()

    async def _send(self, data: bytes, *, more: bool) -> None:
        if self._held:
            self._held.append(data)
            data = b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
        self.writes += 1
        await self._request.send_body(data, more=more)


async def with_heartbeat(
    items: AsyncIterable[T],
    interval: float,
    beat: Callable[[], Awaitable[None]],
    *,
    sink: SseStream | None = None,
) -> AsyncIterator[T]:
    """Yield from `items`, awaiting `beat()` after every `interval` seconds of silence.

    The pending `__anext__` is never cancelled by a beat, so no item is lost. An iterator
    with `next_within(timeout)` (the engine's RequestHandle: the next item, or None after
    `timeout` seconds) is read through it, which costs no Task and no `asyncio.wait` per
    item: at hundreds of tokens a second per stream, those were most of the loop's work.

    With a `sink`, the frames the consumer writes are held while it works through items
    and sent in one write whenever the loop is about to wait (nothing more is ready), so a
    burst of queued events costs one send (SseStream).
    """
    if sink is not None:
        sink.hold()
    try:
        async for item in _heartbeat_items(items, interval, beat, sink):
            yield item
    finally:
        if sink is not None:
            sink.release()


async def _heartbeat_items(
    items: AsyncIterable[T],
    interval: float,
    beat: Callable[[], Awaitable[None]],
    sink: SseStream | None,
) -> AsyncIterator[T]:
    iterator = items.__aiter__()
    next_within = getattr(iterator, "next_within", None)
    ready = getattr(iterator, "ready", None)
    while next_within is not None:
        if sink is not None and not (ready is not None and ready()):
            await sink.flush()  # about to wait: what the last items produced goes out now
        try:
            item = await next_within(interval)
        except StopAsyncIteration:
            return
        if item is None:
            await beat()
        else:
            yield item
    while True:
        if sink is not None:
            await sink.flush()
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
