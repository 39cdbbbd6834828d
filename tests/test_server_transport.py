"""Transport behaviour: disconnects, keep-alive, request ids, doubled prefix, auth, CORS."""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time

import httpx
import openai
import pytest

from fake_engine import FakeEngine
from ninfer.engine_types import EngineConfig
from ninfer.server.config import AppConfig
from server_harness import start_server

MODEL = "fake-chat"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    running = start_server(FakeEngine())
    yield running
    running.stop()


def wait_until(predicate, seconds=3.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_disconnect_mid_stream_frees_the_lane():
    engine = FakeEngine(EngineConfig(max_concurrency=1, max_pending_requests=0))
    running = start_server(engine)
    try:
        body = json.dumps(
            {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "long: x"}]}
        ).encode()
        sock = socket.create_connection(("127.0.0.1", running.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while received.count(b"data: ") < 5:  # the role chunk and a few content deltas
            chunk = sock.recv(4096)
            assert chunk, "server closed the stream early"
            received += chunk
        assert engine.active == 1
        sock.close()
        # The lane is freed by the disconnect itself, not by the request running out.
        assert wait_until(lambda: engine.active == 0 and engine.outstanding == 0)
        client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
        started = time.monotonic()
        reply = client.chat.completions.create(model=MODEL, messages=USER, temperature=0)
        assert reply.choices[0].message.content == "You said: hi."
        assert time.monotonic() - started < 2.0
    finally:
        running.stop()


def test_disconnect_while_waiting_for_a_lane_cancels_the_wait():
    engine = FakeEngine(EngineConfig(max_concurrency=1, max_pending_requests=1))
    running = start_server(engine)
    try:
        long_body = {
            "model": MODEL,
            "stream": True,
            "messages": [{"role": "user", "content": "long: x"}],
        }
        with httpx.stream("POST", running.base_url + "/v1/chat/completions", json=long_body) as r:
            lines = r.iter_lines()  # kept referenced: a collected iterator closes the stream
            next(lines)
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    running.base_url + "/v1/chat/completions",
                    json={"model": MODEL, "messages": USER},
                    timeout=0.3,
                )
            assert wait_until(lambda: engine.outstanding == 1)  # the waiter is gone
        assert wait_until(lambda: engine.outstanding == 0)
    finally:
        running.stop()


def test_keep_alive_comment_during_silence():
    engine = FakeEngine()
    engine.slow_pause = 0.5
    running = start_server(engine, AppConfig(keep_alive_s=0.1))
    try:
        body = {
            "model": MODEL,
            "stream": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "slow: ok"}],
        }
        with httpx.stream("POST", running.base_url + "/v1/chat/completions", json=body) as r:
            lines = [line for line in r.iter_lines() if line]
        assert ": keep-alive" in lines
        first_content = next(i for i, line in enumerate(lines) if '"content":"Y' in line)
        assert lines.index(": keep-alive") < first_content
        content = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in lines
            if line.startswith("data: {")
        )
        assert content == "You said: slow: ok."
        assert lines[-1] == "data: [DONE]"
    finally:
        running.stop()


def test_request_ids_on_every_response(server):
    ids = set()
    responses = [
        httpx.get(server.base_url + "/health"),
        httpx.get(server.base_url + "/v1/models"),
        httpx.post(server.base_url + "/v1/chat/completions", content=b"{"),
        httpx.get(server.base_url + "/nope"),
        httpx.post(
            server.base_url + "/v1/chat/completions",
            json={"model": MODEL, "messages": USER, "temperature": 0},
        ),
    ]
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as streamed:
        streamed.read()
        responses.append(streamed)
    for response in responses:
        ids.add(response.headers["x-request-id"])
    assert len(ids) == len(responses)


def test_doubled_v1_prefix(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1/v1", api_key="x", max_retries=0)
    assert client.models.list().data[0].id == MODEL
    assert client.models.retrieve(MODEL).id == MODEL
    reply = client.chat.completions.create(model=MODEL, messages=USER, temperature=0)
    assert reply.choices[0].message.content == "You said: hi."
    error = httpx.post(server.base_url + "/v1/v1/chat/completions", content=b"{")
    assert error.status_code == 400 and error.headers["x-request-id"]
    assert httpx.get(server.base_url + "/v1/v1/health").status_code == 404
    assert httpx.get(server.base_url + "/v1/v1/v1/models").status_code == 404


def test_model_ids_may_contain_slashes():
    running = start_server(FakeEngine(), model_id="org/model-name")
    try:
        client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
        assert client.models.retrieve("org/model-name").id == "org/model-name"
        reply = client.chat.completions.create(model="org/model-name", messages=USER)
        assert reply.model == "org/model-name"
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=USER)
    finally:
        running.stop()


def test_api_key():
    running = start_server(FakeEngine(), AppConfig(api_key="s3cret"))
    try:
        base = running.base_url
        denied = httpx.get(base + "/v1/models")
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "invalid_api_key"
        assert denied.headers["x-request-id"]
        assert (
            httpx.get(base + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code
            == 401
        )
        assert (
            httpx.get(base + "/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code
            == 200
        )
        assert httpx.get(base + "/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200
        assert httpx.get(base + "/v1/v1/models").status_code == 401
        assert httpx.get(base + "/health").status_code == 200
        assert httpx.options(base + "/v1/chat/completions").status_code == 204
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=base + "/v1", api_key="s3cret", max_retries=0)
        assert client.chat.completions.create(model=MODEL, messages=USER).choices
    finally:
        running.stop()


def test_cors_headers_only_when_enabled(server):
    plain = httpx.get(server.base_url + "/v1/models", headers={"Origin": "http://a.example"})
    assert "access-control-allow-origin" not in plain.headers
    running = start_server(FakeEngine(), AppConfig(cors=True, api_key="k"))
    try:
        preflight = httpx.options(
            running.base_url + "/v1/chat/completions",
            headers={
                "Origin": "http://a.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == "*"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
        actual = httpx.get(running.base_url + "/v1/models", headers={"x-api-key": "k"})
        assert actual.headers["access-control-allow-origin"] == "*"
        assert "x-request-id" in actual.headers["access-control-expose-headers"]
        assert (
            httpx.get(running.base_url + "/v1/models").headers["access-control-allow-origin"] == "*"
        )
    finally:
        running.stop()


def test_stopping_ends_running_and_queued_requests_with_503():
    engine = FakeEngine(EngineConfig(max_concurrency=1, max_pending_requests=2))
    running = start_server(engine)
    results: dict[str, object] = {}

    def stream() -> None:
        body = {
            "model": MODEL,
            "stream": True,
            "messages": [{"role": "user", "content": "long: x"}],
        }
        with httpx.stream("POST", running.base_url + "/v1/chat/completions", json=body) as r:
            results["stream"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    def queued() -> None:
        results["queued"] = httpx.post(
            running.base_url + "/v1/chat/completions",
            json={"model": MODEL, "messages": USER},
            timeout=10,
        )

    threads = [threading.Thread(target=stream)]
    threads[0].start()
    assert wait_until(lambda: engine.active == 1)
    threads.append(threading.Thread(target=queued))
    threads[1].start()
    assert wait_until(lambda: engine.outstanding == 2)
    started = time.monotonic()
    running.stop()
    for t in threads:
        t.join(10)
    assert time.monotonic() - started < 5  # streams do not hold the stop up
    last = json.loads(results["stream"][-1][6:])
    assert last["error"]["code"] == "service_unavailable"
    assert "data: [DONE]" not in results["stream"]
    assert results["queued"].status_code == 503
    assert results["queued"].json()["error"]["code"] == "service_unavailable"
    # cancelled by the stop, whether running or waiting for a lane: said in those words
    assert last["error"]["message"] == "the server is shutting down"
    assert results["queued"].json()["error"]["message"] == "the server is shutting down"


def test_stop_while_a_stream_waits_for_a_lane_says_the_server_is_shutting_down(caplog):
    engine = FakeEngine(EngineConfig(max_concurrency=1, max_pending_requests=2))
    running = start_server(engine, AppConfig(keep_alive_s=0.1))
    _, release = _held_lane(running, engine)
    lines: list[str] = []

    def queued_stream() -> None:
        body = {"model": MODEL, "stream": True, "messages": USER}
        with httpx.stream("POST", running.base_url + "/v1/chat/completions", json=body) as r:
            lines.extend(line for line in r.iter_lines() if line.startswith("data: "))

    thread = threading.Thread(target=queued_stream)
    thread.start()
    assert wait_until(lambda: engine.outstanding == 2)
    running.stop()
    thread.join(10)
    release()
    assert len(lines) == 1
    error = json.loads(lines[0][6:])["error"]
    assert (error["code"], error["message"]) == (
        "service_unavailable",
        "the server is shutting down",
    )
    assert "request was cancelled" not in caplog.text


def _accepted_socket_options(client: socket.socket) -> dict[str, int]:
    """Read the options of the server's end of `client` (the server runs in this process)."""
    import os

    names = ["TCP_NODELAY", "TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT", "TCP_USER_TIMEOUT"]
    for fd in os.listdir("/proc/self/fd"):
        try:
            candidate = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        with candidate:
            try:
                if candidate.type != socket.SOCK_STREAM or candidate.getpeername() != (
                    client.getsockname()
                ):
                    continue
            except OSError:
                continue
            found = {"SO_KEEPALIVE": candidate.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)}
            for name in names:
                found[name] = candidate.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
            return found
    raise AssertionError("the accepted socket was not found")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux socket options")
def test_accepted_connections_use_keepalive_and_a_retransmission_limit():
    from ninfer.server import listener

    running = start_server(FakeEngine())
    try:
        with socket.create_connection(("127.0.0.1", running.port)) as client:
            client.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(4096).startswith(b"HTTP/1.1 200")
            options = _accepted_socket_options(client)
        assert options == {
            "SO_KEEPALIVE": 1,
            "TCP_NODELAY": 1,  # SSE frames are not held back by Nagle's algorithm
            "TCP_KEEPIDLE": listener.KEEPALIVE_IDLE_S,
            "TCP_KEEPINTVL": listener.KEEPALIVE_INTERVAL_S,
            "TCP_KEEPCNT": listener.KEEPALIVE_PROBES,
            "TCP_USER_TIMEOUT": 15_000,
        }
    finally:
        running.stop()
    with pytest.raises(ConnectionRefusedError):  # stopped: the listener is closed
        socket.create_connection(("127.0.0.1", running.port), timeout=2).close()


def _held_lane(running, engine):
    """Start a stream that holds the only lane until closed; returns (response, close)."""
    client = httpx.Client(timeout=10)
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "long: x"}]}
    context = client.stream("POST", running.base_url + "/v1/chat/completions", json=body)
    response = context.__enter__()
    lines = response.iter_lines()
    next(lines)
    assert wait_until(lambda: engine.active == 1)

    def close() -> None:
        context.__exit__(None, None, None)
        client.close()

    return lines, close


def test_queued_stream_sends_keep_alive_until_it_gets_a_lane():
    engine = FakeEngine(EngineConfig(max_concurrency=1, max_pending_requests=1))
    running = start_server(engine, AppConfig(keep_alive_s=0.1))
    try:
        holder_lines, release = _held_lane(running, engine)
        body = {
            "model": MODEL,
            "stream": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "queued"}],
        }
        with httpx.stream("POST", running.base_url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200  # headers before admission
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            seen = [line for line in (next(lines) for _ in range(6)) if line]
            assert set(seen) == {": keep-alive"}  # still queued: comments only
            assert engine.active == 1 and engine.outstanding == 2
            release()
            rest = [line for line in lines if line]
        data = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
        assert data[0]["choices"][0]["delta"]["role"] == "assistant"
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in data)
        assert content == "You said: queued."
        assert rest[-1] == "data: [DONE]"
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "stream": True, "messages": USER}),
        ("/v1/completions", {"model": MODEL, "stream": True, "prompt": "hi"}),
    ],
)
def test_queue_timeout_on_a_started_stream_is_one_error_event(path, body, caplog):
    caplog.set_level(logging.INFO, logger="ninfer.server")
    engine = FakeEngine(
        EngineConfig(max_concurrency=1, max_pending_requests=1, pending_timeout_ms=400)
    )
    running = start_server(engine, AppConfig(keep_alive_s=0.1))
    try:
        _, release = _held_lane(running, engine)
        with httpx.stream("POST", running.base_url + path, json=body) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        release()
        assert ": keep-alive" in lines
        data = [line for line in lines if line.startswith("data: ")]
        assert len(data) == 1  # no role chunk, no [DONE]: only the error
        error = json.loads(data[0][6:])["error"]
        assert error["code"] == "request_queue_timeout"
        assert wait_until(lambda: engine.outstanding == 0)
        assert wait_until(lambda: "stream ended with 503 request_queue_timeout" in caplog.text)
    finally:
        running.stop()


def test_request_heads_up_to_the_documented_limit_reach_the_app(server):
    from ninfer.server.embedded import MAX_REQUEST_HEAD_BYTES

    big = httpx.get(server.base_url + "/health", headers={"x-big": "a" * 1_000_000})
    assert big.status_code == 200, big.status_code
    many = httpx.get(server.base_url + "/health", headers={f"x-h{i}": "v" for i in range(90)})
    assert many.status_code == 200
    too_big = httpx.get(
        server.base_url + "/health", headers={"x-big": "a" * (2 * MAX_REQUEST_HEAD_BYTES)}
    )
    assert too_big.status_code == 431
