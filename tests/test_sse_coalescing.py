"""SSE frame coalescing (server/sse.py): events that are ready together leave in one write,
each still a whole SSE event, and the stream's bytes are those of one write per event."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from typing import Any

import httpx
import pytest

from fake_engine import FakeEngine, FakeHandle
from ninfer.server.sse import SseStream, with_heartbeat
from server_harness import start_server


class _Request:
    """The part of HttpRequest an SseStream uses, recording every body send."""

    def __init__(self) -> None:
        self.sends: list[tuple[bytes, bool]] = []

    async def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        pass

    async def send_body(self, data: bytes, *, more: bool = False) -> None:
        self.sends.append((data, more))


class _Source:
    """next_within/ready like the engine's RequestHandle; `burst`: everything is ready at
    once, else each item arrives after a wait."""

    def __init__(self, count: int, burst: bool) -> None:
        self._items = collections.deque(range(count))
        self._burst = burst

    def __aiter__(self) -> _Source:
        return self

    def ready(self) -> int:
        return len(self._items) if self._burst else 0

    async def next_within(self, timeout: float | None) -> int | None:
        if not self._items:
            raise StopAsyncIteration
        if not self._burst:
            await asyncio.sleep(0)
        return self._items.popleft()


async def _stream(count: int, burst: bool) -> _Request:
    request = _Request()
    sse = SseStream(request)  # type: ignore[arg-type]
    await sse.open()

    async def beat() -> None:
        await sse.keep_alive()

    async for item in with_heartbeat(_Source(count, burst), 5.0, beat, sink=sse):
        await sse.event({"n": item, "text": "x" * (item % 7)})
        if item == count - 1:
            await sse.event({"usage": {"completion_tokens": count}})
            await sse.finish()
    return request


def _body(request: _Request) -> bytes:
    return b"".join(data for data, _ in request.sends)


def test_a_burst_is_one_write_with_the_same_bytes():
    burst = asyncio.run(_stream(20, burst=True))
    trickle = asyncio.run(_stream(20, burst=False))
    assert _body(burst) == _body(trickle)
    assert len(trickle.sends) == 20  # one per item; the last carries usage and [DONE]
    assert len(burst.sends) == 1
    assert [more for _, more in burst.sends] == [False]  # the close rides on the last write
    events = _body(burst).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert all(e.startswith(b"data: {") for e in events[:-2])  # every frame a whole event


def test_a_long_burst_still_goes_out_in_bounded_pieces():
    request = asyncio.run(_stream(200, burst=True))
    limit = SseStream.MAX_HELD_FRAMES
    assert len(request.sends) == -(-201 // limit)  # 200 events and the usage event
    assert _body(request) == _body(asyncio.run(_stream(200, burst=False)))


def test_frames_outside_a_held_loop_go_out_at_once():
    async def run() -> _Request:
        request = _Request()
        sse = SseStream(request)  # type: ignore[arg-type]
        await sse.event({"type": "message_start"})
        await sse.named_event("ping", {"type": "ping"})
        assert len(request.sends) == 2  # not held: nothing waits for a later flush
        await sse.close()
        return request

    request = asyncio.run(run())
    assert request.sends[-1] == (b"", False)


# --- through the server: a Chat Completions stream whose events arrive together ---------


class _BurstHandle(FakeHandle):
    """A fake engine's handle that reads like RequestHandle; with `burst` set, all of the
    request's events are ready at once (a loop that fell behind, a multi-token commit)."""

    burst = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._queue: collections.deque[Any] | None = None

    def __aiter__(self) -> _BurstHandle:
        return self

    def ready(self) -> int:
        return len(self._queue) if self.burst and self._queue else 0

    async def next_within(self, timeout: float | None) -> Any:
        if self._queue is None:
            await self.admitted()
            self._queue = collections.deque([event async for event in self._generate()])
            self._release()
        if not self._queue:
            raise StopAsyncIteration
        if not self.burst:
            await asyncio.sleep(0)
        return self._queue.popleft()


class _BurstEngine(FakeEngine):
    def submit(self, request: Any) -> _BurstHandle:
        handle = super().submit(request)
        return _BurstHandle(self, handle.request_id, request)


class _CountBodies:
    """ASGI wrapper: the number of response body messages of each chat request, recorded
    when the app returns (which can be just after the client has read the last byte)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.counts: list[int] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.app(scope, receive, send)
        count = [0]

        async def counting(message: dict) -> None:
            if message["type"] == "http.response.body":
                count[0] += 1
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            self.counts.append(count[0])


@pytest.fixture(scope="module")
def burst_server():
    engine = _BurstEngine()
    engine.token_delay = 0.0
    holder: dict[str, _CountBodies] = {}

    def wrap(app: Any) -> _CountBodies:
        holder["app"] = _CountBodies(app)
        return holder["app"]

    running = start_server(engine, wrap=wrap)
    yield running, holder["app"]
    running.stop()


def _chat(base_url: str) -> list[Any]:
    body = {
        "model": "fake-chat",
        "messages": [{"role": "user", "content": "Tell me a story about streams."}],
        "max_tokens": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        text = r.read().decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    payloads = []
    for event in events[:-1]:
        assert event.startswith("data: {") and "\n" not in event
        payload = json.loads(event.removeprefix("data: "))
        for varying in ("id", "created", "timings"):  # differ between any two requests
            payload.pop(varying, None)
        payloads.append(payload)
    return payloads


def _writes_of_next(counter: _CountBodies, seen: int) -> int:
    deadline = time.monotonic() + 10
    while len(counter.counts) <= seen and time.monotonic() < deadline:
        time.sleep(0.01)
    return counter.counts[seen]


def test_chat_stream_burst_is_fewer_writes_same_events(burst_server):
    running, counter = burst_server
    seen = len(counter.counts)
    _BurstHandle.burst = False
    try:
        one_by_one = _chat(running.base_url)
    finally:
        _BurstHandle.burst = True
    trickle_writes = _writes_of_next(counter, seen)
    together = _chat(running.base_url)
    burst_writes = _writes_of_next(counter, seen + 1)
    assert together == one_by_one
    assert len(together) > 40  # role, 40 content chunks, finish, usage
    assert trickle_writes >= 40
    assert burst_writes <= 3  # the role chunk, then the whole answer with [DONE]
