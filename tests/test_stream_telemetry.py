"""Streams read the engine handle through `next_within` (sse.with_heartbeat); the request
telemetry that wraps the handle must still see every event, the first token and the end, on
every streaming protocol. The requests are bench_serve.py's own, so its wire formats are
checked against this server's too."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ninfer._core")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_serve  # noqa: E402
from bench_http_overhead import toy_engine  # noqa: E402
from serve_endpoints import ENDPOINTS, GenerationOptions  # noqa: E402
from serve_metrics import RequestRecord  # noqa: E402
from server_harness import start_server  # noqa: E402

STREAMED = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]


@pytest.fixture(scope="module")
def server():
    running = start_server(toy_engine(2, 2000))
    yield running
    running.stop()


def _settled(session, count: int) -> None:
    deadline = time.monotonic() + 5
    while session.completed + session.failed < count and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize("path", STREAMED)
def test_streamed_requests_complete_in_the_telemetry(server, path):
    session = server.app.telemetry.session
    before = (session.completed, session.failed, session.all_time.decode_tokens)
    endpoint = ENDPOINTS[path]
    body = endpoint.body("hi there", GenerationOptions("toy", 8, True, 0.0))
    record = RequestRecord(prompt_len=2)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            await bench_serve.send_request(client, endpoint, body, record)

    asyncio.run(run())
    assert record.success, record.error
    assert record.output_tokens is not None and 1 <= record.output_tokens <= 8
    assert record.served_prompt_tokens is not None and record.served_prompt_tokens > 2
    _settled(session, before[0] + before[1] + 1)
    assert (session.completed - before[0], session.failed - before[1]) == (1, 0)
    # The first token was seen: the tokens after it count as decode.
    assert session.all_time.decode_tokens - before[2] == record.output_tokens - 1
