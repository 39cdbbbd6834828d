"""Every error shape of the chat endpoint: status, OpenAI envelope, code and param."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx
import openai
import pytest

from fake_engine import CHATML_TEMPLATE, FakeEngine
from ninfer.engine_types import EngineConfig
from ninfer.prompt import ChatTemplate
from ninfer.server.config import AppConfig
from server_harness import start_server

MODEL = "fake-chat"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    running = start_server(FakeEngine(max_context=256), AppConfig(max_request_mib=1))
    yield running
    running.stop()


def post(server, body, **kwargs):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.base_url + "/v1/chat/completions", content=content, **kwargs)


def assert_error(response, status, code, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]
    assert response.headers["x-request-id"]
    return error


def test_malformed_json(server):
    assert_error(post(server, b'{"model": "fake-chat", "messages": ['), 400, "invalid_json")
    assert_error(post(server, b"[1, 2]"), 400, "invalid_type")


@pytest.mark.parametrize(
    ("patch", "code", "param"),
    [
        ({"model": 5}, "invalid_type", "model"),
        ({"max_tokens": "ten"}, "invalid_type", "max_tokens"),
        ({"max_tokens": -1}, "invalid_value", "max_tokens"),
        ({"temperature": 2.5}, "invalid_value", "temperature"),
        ({"top_p": 1.5}, "invalid_value", "top_p"),
        ({"top_k": 21}, "invalid_value", "top_k"),
        ({"min_p": -0.1}, "invalid_value", "min_p"),
        ({"presence_penalty": 3}, "invalid_value", "presence_penalty"),
        ({"seed": 1 << 64}, "invalid_value", "seed"),
        ({"stream": "yes"}, "invalid_type", "stream"),
        ({"messages": [{"role": "user", "content": 5}]}, "invalid_type", "messages[0].content"),
        ({"messages": [{"content": "x"}]}, "missing_required_parameter", "messages[0].role"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_value", "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "invalid_value", "messages[0].content"),
        ({"messages": []}, "invalid_value", "messages"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_value", "stop"),
        ({"stop": ["a", ""]}, "invalid_value", "stop[1]"),
        ({"stream_options": {"include_usage": True}}, "invalid_value", "stream_options"),
        ({"model": "gpt-4o"}, "model_not_found", "model"),
        ({"n": 2}, "unsupported_parameter", "n"),
        ({"verbosity": "high"}, "unsupported_parameter", "verbosity"),
        ({"web_search_options": {}}, "unsupported_parameter", "web_search_options"),
        ({"function_call": {"name": "f"}}, "unsupported_parameter", "function_call"),
        ({"logit_bias": {"5": 1.5}}, "unsupported_parameter", "logit_bias"),
        ({"logprobs": True}, "unsupported_parameter", "logprobs"),
        (
            {"tools": [{"type": "function", "function": {}}]},
            "invalid_value",
            "tools[0].function.name",
        ),
        ({"response_format": {"type": "json_object"}}, "unsupported_parameter", "response_format"),
        (  # this template has no tool-call markup, so no call can be required of the model
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "required",
            },
            "unsupported_parameter",
            "tool_choice",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "vision_disabled",
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "missing_required_parameter",
            "messages[0].tool_call_id",
        ),
    ],
)
def test_invalid_fields_name_their_param(server, patch, code, param):
    body = {"model": MODEL, "messages": USER, **patch}
    assert_error(post(server, body), 400, code, param)


def test_missing_model(server):
    assert_error(post(server, {"messages": USER}), 400, "missing_required_parameter", "model")


def test_unknown_fields_are_ignored(server):
    response = post(
        server, {"model": MODEL, "messages": USER, "temperature": 0, "user": "u", "x": 1}
    )
    assert response.status_code == 200


def test_body_over_limit_is_413_before_parsing(server):
    oversize = b"{" + b" " * (1 << 20) + b"}"  # not even valid JSON: parsing never happens
    assert_error(post(server, oversize), 413, "request_too_large")
    chunked = httpx.post(
        server.base_url + "/v1/chat/completions", content=iter([b" " * (600 << 10)] * 2)
    )
    assert_error(chunked, 413, "request_too_large")


def test_context_length_exceeded_names_both_numbers(server):
    error = assert_error(
        post(server, {"model": MODEL, "messages": [{"role": "user", "content": "z" * 400}]}),
        400,
        "context_length_exceeded",
        "messages",
    )
    rendered = ChatTemplate(CHATML_TEMPLATE, bos_token="", eos_token="").render(
        [{"role": "user", "content": "z" * 400}]
    )
    prompt_tokens = len(server.engine.tokenizer.encode(rendered))
    assert f"{prompt_tokens} tokens" in error["message"]
    assert "256 tokens" in error["message"]


def test_not_found_and_method_not_allowed(server):
    assert_error(httpx.get(server.base_url + "/v1/nothing"), 404, "not_found")
    assert_error(httpx.get(server.base_url + "/v1/chat/completions"), 405, "method_not_allowed")


def test_engine_failure_in_aggregate_is_500(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "fail: now"}]}
    assert_error(post(server, body), 500, "engine_error")


def test_failure_after_stream_started_is_one_error_event(server):
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "fail: now"}]}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in data
    last = json.loads(data[-1])
    assert last["error"]["code"] == "engine_error"
    assert all("error" not in json.loads(d) for d in data[:-1])
    assert not any(json.loads(d)["choices"][0]["finish_reason"] for d in data[:-1])
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "fail: now"}], stream=True
        ):
            pass


@contextmanager
def held_lane(server):
    """A streaming request that occupies a lane until the block ends."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "long: x"}]}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(lines)  # the role chunk: the request holds its lane
        yield


def test_overloaded_is_429():
    running = start_server(FakeEngine(EngineConfig(max_concurrency=1, max_pending_requests=0)))
    try:
        client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
        with held_lane(running):
            with pytest.raises(openai.RateLimitError) as caught:
                client.chat.completions.create(model=MODEL, messages=USER)
            assert caught.value.body["code"] == "server_overloaded"
    finally:
        running.stop()


def test_queue_timeout_is_503():
    engine = FakeEngine(
        EngineConfig(max_concurrency=1, max_pending_requests=1, pending_timeout_ms=200)
    )
    running = start_server(engine)
    try:
        with held_lane(running):
            response = post(running, {"model": MODEL, "messages": USER})
            assert_error(response, 503, "request_queue_timeout")
    finally:
        running.stop()
