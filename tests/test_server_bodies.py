"""Bodies must be JSON text, fields a struct skips included: every body-reading route, one answer.

Deep nesting, invalid UTF-8 and lone surrogate escapes (in any string, and in the fields the
OpenAI routes ignore), and integers beyond int64, each get a 400 in the route's own envelope
that says what is wrong. The routes come from the app's own table, so a route added later is
covered without editing this file (it starts from `{"model": ...}`).
"""

from __future__ import annotations

import json

import httpx
import pytest

from fake_engine import FakeEngine
from ninfer.server.app import ROUTES
from server_harness import start_server

MODEL = "fake-chat"
USER = [{"role": "user", "content": "hi"}]
# A valid body for each route that reads one.
BODIES: dict[str, dict] = {
    "/v1/chat/completions": {"model": MODEL, "messages": USER},
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
    "/tokenize": {"model": MODEL, "prompt": "hi"},
    "/detokenize": {"model": MODEL, "tokens": [100]},
    "/v1/messages": {"model": MODEL, "max_tokens": 8, "messages": USER},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": USER},
    "/v1/responses": {"model": MODEL, "input": "hi"},
    "/v1/responses/input_tokens": {"model": MODEL, "input": "hi"},
    "/v1/responses/compact": {"model": MODEL, "input": "hi"},
}
POST_PATHS = [route.path for route in ROUTES if route.method == "POST" and "{" not in route.path]
# The OpenAI-style routes ignore these advisory fields (Responses refuses unknown fields).
OPENAI_PATHS = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]
IGNORED_FIELDS = ["metadata", "user", "prediction", "prompt_cache_key", "service_tier"]


@pytest.fixture(scope="module")
def server():
    running = start_server(FakeEngine(max_context=256))
    yield running
    running.stop()


def post(server, path: str, content: bytes) -> httpx.Response:
    return httpx.post(
        server.base_url + path,
        content=content,
        headers={"content-type": "application/json"},
        timeout=10,
    )


def assert_envelope(response: httpx.Response, status: int, code: str) -> str:
    """The error's message, after checking status, code and the route's envelope."""
    assert response.status_code == status, response.text
    body = response.json()
    error = body["error"]
    if response.url.path.startswith("/v1/messages"):  # Anthropic's, with NInfer's code
        assert body["type"] == "error" and error["type"] == "invalid_request_error", body
    else:
        assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    return error["message"]


def with_field(name: str, raw_value: bytes, path: str = "/v1/chat/completions") -> bytes:
    """The route's valid body with `name` set to raw (possibly not UTF-8) JSON bytes."""
    valid = json.dumps(BODIES.get(path, {"model": MODEL}))
    return valid[:-1].encode() + b', "' + name.encode() + b'": ' + raw_value + b"}"


def with_model(raw_model: bytes, path: str) -> bytes:
    """The route's valid body with raw bytes inside its `model` string."""
    body = json.dumps({**BODIES.get(path, {}), "model": "MODEL"}).encode()
    return body.replace(b'"MODEL"', b'"' + raw_model + b'"')


def test_every_body_reading_route_is_covered():
    assert set(OPENAI_PATHS) <= set(POST_PATHS)


@pytest.mark.parametrize("path", POST_PATHS)
@pytest.mark.parametrize("raw", [b"fake\xe9chat", b"fake\xff", b"\xed\xa0\x80"])
def test_invalid_utf8_in_any_string_is_invalid_json(server, path, raw):
    message = assert_envelope(post(server, path, with_model(raw, path)), 400, "invalid_json")
    assert "UTF-8" in message


@pytest.mark.parametrize("path", POST_PATHS)
def test_lone_surrogate_in_any_string_says_what_is_wrong(server, path):
    response = post(server, path, with_model(b"fake\\ud800", path))
    message = assert_envelope(response, 400, "invalid_json")
    assert "surrogate" in message and "truncated" not in message


@pytest.mark.parametrize("path", OPENAI_PATHS)
@pytest.mark.parametrize("depth", [1000, 5000])
def test_deep_nesting_in_an_ignored_field_is_a_400(server, path, depth):
    deep = b"[" * depth + b"]" * depth
    message = assert_envelope(
        post(server, path, with_field("metadata", deep, path)), 400, "json_too_deep"
    )
    assert "nest" in message


@pytest.mark.parametrize("path", POST_PATHS)
def test_deep_nesting_as_the_whole_body_is_a_400(server, path):
    response = post(server, path, b'{"a":' * 3000 + b"1" + b"}" * 3000)
    # Too deep to decode, or refused before that (Responses refuses the unknown key `a`,
    # /v1/responses/compact the whole operation): a 400 in the envelope, never a 500.
    code = response.json()["error"].get("code") if response.status_code == 400 else None
    assert code in ("json_too_deep", "unknown_parameter", "compaction_not_supported"), code
    assert_envelope(response, 400, code)


@pytest.mark.parametrize("path", OPENAI_PATHS)
@pytest.mark.parametrize("field", IGNORED_FIELDS)
def test_invalid_utf8_in_an_ignored_field_is_invalid_json(server, path, field):
    message = assert_envelope(
        post(server, path, with_field(field, b'"caf\xe9 \xff"', path)), 400, "invalid_json"
    )
    assert "UTF-8" in message and "0xe9" in message


@pytest.mark.parametrize("path", OPENAI_PATHS)
@pytest.mark.parametrize("escape", [b"\\ud800", b"\\uDBFFx", b"\\udc00"])
def test_lone_surrogate_escape_says_what_is_wrong(server, path, escape):
    body = with_field("user", b'"a' + escape + b'"', path)
    message = assert_envelope(post(server, path, body), 400, "invalid_json")
    assert "surrogate" in message and "truncated" not in message


def test_paired_surrogates_and_escaped_backslashes_are_text(server):
    body = with_field("user", b'"\\ud83d\\ude00 \\\\ud800"')
    assert post(server, "/v1/chat/completions", body).status_code == 200
    tokenized = post(server, "/tokenize", json.dumps({"prompt": "\U0001f600 \\ud800"}).encode())
    assert tokenized.status_code == 200, tokenized.text


def test_truncated_body_keeps_its_own_message(server):
    message = assert_envelope(
        post(server, "/v1/completions", b'{"prompt": "x'), 400, "invalid_json"
    )
    assert "truncated" in message


@pytest.mark.parametrize("value", [2**63, 2**64, 2**70, -(2**63) - 1, -(2**70)])
def test_completions_max_tokens_out_of_range_names_the_field(server, value):
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": value}).encode()
    response = post(server, "/v1/completions", body)
    assert_envelope(response, 400, "invalid_value")
    assert response.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("value", [0, -1])
def test_completions_max_tokens_nonpositive_still_means_no_limit(server, value):
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": value}).encode()
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/chat/completions", "max_completion_tokens"),
        ("/v1/chat/completions", "min_tokens"),
        ("/v1/chat/completions", "top_logprobs"),
        ("/v1/chat/completions", "n"),
        ("/v1/completions", "best_of"),
        ("/v1/completions", "logprobs"),
    ],
)
def test_other_integer_fields_out_of_range_name_the_field(server, path, field):
    body = {"model": MODEL, field: 2**64}
    body |= (
        {"prompt": "hi"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    response = post(server, path, json.dumps(body).encode())
    assert_envelope(response, 400, "invalid_value")
    assert response.json()["error"]["param"] == field


def test_server_still_answers_after_hostile_bodies(server):
    for path in POST_PATHS:
        post(server, path, b"[" * 100_000)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"].startswith("You said: hi.")


@pytest.mark.parametrize(
    ("text", "lone_at"),
    [
        (rb'"\ud800"', 1),
        (rb'"\udc00"', 1),
        (rb'"\uDBFFx"', 1),
        (rb'"\ud800\ud800\udc00"', 1),  # the first high has no low after it
        (rb'"\ud83d\ude00\udc00"', 13),  # a pair, then a low alone
        (rb'"\\\ud800"', 3),  # an escaped backslash, then a real escape
        (rb'"\ud800\udc00"', None),
        (rb'"\uDBFF\uDFFF"', None),
        (rb'"\\ud800"', None),  # an escaped backslash, then the text "ud800"
        (rb'"\u00e9 plain"', None),
    ],
)
def test_lone_surrogate_detection(text, lone_at):
    from ninfer.server.errors import ApiError
    from ninfer.server.json_text import check_json_text

    if lone_at is None:
        check_json_text(text)
        return
    with pytest.raises(ApiError) as info:
        check_json_text(text)
    assert f"at offset {lone_at} " in info.value.message
