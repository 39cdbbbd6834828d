"""Streams read the engine handle through `next_within` (sse.with_heartbeat); the request
telemetry that wraps the handle must still see every event, the first token and the end."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ninfer._core")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_http_overhead import toy_engine  # noqa: E402
from server_harness import start_server  # noqa: E402


def test_streamed_requests_complete_in_the_telemetry():
    running = start_server(toy_engine(2, 2000))
    try:
        body = {
            "model": "toy",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream(
            "POST", running.base_url + "/v1/chat/completions", json=body, timeout=30
        ) as r:
            assert r.status_code == 200
            assert "data: [DONE]" in list(r.iter_lines())
        aggregate = httpx.post(
            running.base_url + "/v1/chat/completions", json={**body, "stream": False}, timeout=30
        )
        assert aggregate.status_code == 200
        session = running.app.telemetry.session
        deadline = time.monotonic() + 5
        while session.completed < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        running.stop()
    assert (session.completed, session.failed, session.cancelled) == (2, 0, 0)
    assert session.all_time.requests == 2 and session.all_time.ttft_s > 0  # first tokens seen
    assert session.all_time.decode_tokens == 2 * 7  # the tokens after each first one
