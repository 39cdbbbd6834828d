"""`ninfer-serve` (fake engine) end to end: stderr records, the request log, and how a stop
ends requests in flight: running and queued streams get an error event, the log one
request_error each, and the process says `server stopped` and exits 0."""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time

import httpx
import pytest

from test_server_stop import MODEL, ServerProcess

KEY = "console-secret-key"
RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (TRACE|DEBUG|INFO|WARNING|ERROR|CRITICAL) "
)
LONG = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "long: x"}]}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _stream(server: ServerProcess, lines: list[str], started: threading.Event) -> None:
    with httpx.stream(
        "POST",
        server.base_url + "/v1/chat/completions",
        json=LONG,
        headers={"x-api-key": KEY},
        timeout=20,
    ) as response:
        started.set()
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append(line)


def test_records_log_and_sigterm_with_streams_in_flight(tmp_path):
    log_path = tmp_path / "requests.jsonl"
    server = ServerProcess(
        "--api-key", KEY, "--max-concurrency", "1", "--request-log-jsonl", str(log_path),
        "--log-stats-interval-ms", "200",
    )  # fmt: skip
    try:
        server.wait_ready()
        reply = httpx.post(
            server.base_url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "model": MODEL,
                "temperature": 0,
                "messages": [{"role": "user", "content": "hi"}],
            },
            timeout=10,
        )
        assert reply.status_code == 200
        server.wait_for_log("req#1 done: chat/completions")
        streams = [([], threading.Event()) for _ in range(2)]  # one running, one queued
        threads = [threading.Thread(target=_stream, args=(server, *s)) for s in streams]
        for thread in threads:
            thread.start()
            time.sleep(0.2)
        assert all(started.wait(10) for _, started in streams)
        server.wait_for_log("throughput: ")
        stopped_at = time.monotonic()
        server.signal(signal.SIGTERM)
        assert server.wait_exit(10) == 0
        assert time.monotonic() - stopped_at < 10
        for thread in threads:
            thread.join(10)
    finally:
        server.kill()

    for lines, _ in streams:  # each ended with the 503 error event, never [DONE]
        assert json.loads(lines[-1][6:])["error"]["code"] == "service_unavailable"
    stderr = server.log()
    assert KEY not in stderr and "\x1b" not in stderr  # redirected: no control sequences
    assert all(RECORD.match(line) for line in server.lines), stderr
    assert "server stopped" in server.lines[-1]
    done = next(line for line in server.lines if "req#1 done" in line)
    assert "prompt " in done and "completion " in done and "TTFT " in done and "decode " in done
    assert sum("cancelled: chat/completions, server stopping" in line for line in server.lines) == 2

    text = log_path.read_text(encoding="utf-8")
    assert KEY not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert records[0]["event"] == "server_start"
    assert "<redacted>" in records[0]["argv"]
    assert {r["server_instance_id"] for r in records} == {records[0]["server_instance_id"]}
    assert all(r["schema"] == "ninfer_serve_request_log" for r in records)
    starts = sorted(r["request_id"] for r in records if r["event"] == "request_start")
    ends = [r for r in records if r["event"] in ("request_done", "request_error")]
    assert starts == [1, 2, 3] and sorted(r["request_id"] for r in ends) == starts
    errors = [r for r in ends if r["event"] == "request_error"]
    assert [r["error"] for r in errors] == [{"kind": "cancelled", "message": "server stopping"}] * 2
    assert any(r["event"] == "throughput" for r in records)
