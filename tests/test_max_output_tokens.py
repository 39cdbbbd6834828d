"""--max-output-tokens: one process-wide ceiling on every request's output budget.

Agent clients ask for 32k-token budgets; a server for random weights or a shared box caps
them. The cap binds like a request's own limit: each protocol reports its `length` ending.
"""

from __future__ import annotations

import httpx
import pytest

from fake_engine import FakeEngine
from ninfer.engine_types import EngineConfig
from server_harness import start_server
from test_server_stop import ServerProcess

CAP = 7
MODEL = "fake-chat"
ENDLESS = "long: go"  # the fake engine repeats "tick " until the budget ends


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(EngineConfig(max_concurrency=2))
    engine.scripted["short"] = "ok"
    running = start_server(engine, default_max_tokens=100, max_output_tokens=CAP)
    yield running
    running.stop()


def post(server, path: str, body: dict) -> dict:
    reply = httpx.post(server.base_url + path, json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()


def chat(content: str, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


@pytest.mark.parametrize("fields", [{"max_tokens": 32768}, {"max_completion_tokens": 50}, {}])
def test_chat_completions_end_with_length_at_the_cap(server, fields):
    body = post(server, "/v1/chat/completions", chat(ENDLESS, **fields))
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == CAP


def test_a_smaller_request_budget_still_wins(server):
    body = post(server, "/v1/chat/completions", chat(ENDLESS, max_tokens=3))
    assert (body["choices"][0]["finish_reason"], body["usage"]["completion_tokens"]) == (
        "length",
        3,
    )


def test_an_answer_shorter_than_the_cap_is_untouched(server):
    body = post(server, "/v1/chat/completions", chat("short", max_tokens=32768))
    assert body["choices"][0]["message"]["content"] == "ok"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_messages_end_with_max_tokens(server):
    body = post(
        server,
        "/v1/messages",
        {"model": "any", "max_tokens": 32000, "messages": [{"role": "user", "content": ENDLESS}]},
    )
    assert body["stop_reason"] == "max_tokens"
    assert body["usage"]["output_tokens"] == CAP


def test_responses_end_incomplete(server):
    body = post(
        server, "/v1/responses", {"model": MODEL, "input": ENDLESS, "max_output_tokens": 5000}
    )
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == CAP


def test_completions_end_with_length(server):
    body = post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1})
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == CAP


def test_flag_is_parsed_logged_and_applied():
    process = ServerProcess("--max-output-tokens", "4", "--log-level", "info")
    try:
        process.wait_ready()
        assert "output ceiling: 4 tokens per request" in process.log()
        reply = httpx.post(
            process.base_url + "/v1/chat/completions", json=chat(ENDLESS, max_tokens=999)
        )
        assert reply.json()["usage"]["completion_tokens"] == 4
    finally:
        process.kill()


def test_flag_refuses_zero():
    process = ServerProcess("--max-output-tokens", "0")
    try:
        assert process.wait_exit(15) == 2
        assert "--max-output-tokens" in process.log()
    finally:
        process.kill()
