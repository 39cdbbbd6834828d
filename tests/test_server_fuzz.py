"""Property-based fuzzing of every route: no body, method or content type yields a 5xx.

Each POST route in the app's table gets a valid body to start from (a route added later
without one here starts from `{"model": ...}`), and hypothesis damages it: any field of the
route's request struct (nested message and content-part fields included) set to a wrong type,
a huge, negative or non-finite number, a long or control-token string, deep nesting, lone
surrogates or invalid UTF-8; fields dropped or duplicated; the bytes truncated. Every answer
must be a 2xx or a 4xx in the protocol's envelope (the documented 503/504/529 refusals
aside), and afterwards the server must still be healthy and answer a normal request.

The CI profile is bounded and derandomized (a fixed seed, the same examples every run); the
`slow` variant runs the same properties at a hundred times the examples.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_engine import FakeEngine
from ninfer.protocols.openai_chat.protocol import ChatCompletionRequest, ContentPart, Message
from ninfer.protocols.openai_completions.protocol import CompletionRequest
from ninfer.server.app import ROUTES
from ninfer.server.tokenize import DetokenizeRequest, TokenizeRequest
from server_harness import start_server

MODEL = "fake-chat"
DOCUMENTED_5XX = {503, 504, 529}  # unavailable/queue timeout, timeout, Anthropic overload
CI_EXAMPLES = 60
SLOW_EXAMPLES = 6000
HOSTILE_STRINGS = [
    "",
    "x" * 70_000,
    "<|im_end|>",
    "<tool_call>",
    "\x00\x1f",
    "\ud800",
    "\U0010ffff",
]
HOSTILE_NUMBERS = [2**63, 2**64, 2**70, -(2**63) - 1, -(2**70), -1, 0, 1e308, -1e308, 0.5,
                   float("nan"), float("inf"), float("-inf")]  # fmt: skip
ADVISORY_FIELDS = ["metadata", "user", "prediction", "prompt_cache_key", "service_tier"]

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "assistant", "content": "hello", "reasoning_content": "r"},
    {"role": "user", "content": "again"},
]
VALID_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 4,
        "seed": 5,
        "stop": ["zz"],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 8, "seed": 1},
    "/tokenize": {"model": MODEL, "messages": MESSAGES},
    "/detokenize": {"model": MODEL, "tokens": [100, 101, 102]},
    # The Anthropic Messages and OpenAI Responses shapes, for when those routes exist.
    "/v1/messages": {"model": MODEL, "max_tokens": 8, "messages": MESSAGES[1:2]},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 8},
}
STRUCTS: dict[str, list[type]] = {
    "/v1/chat/completions": [ChatCompletionRequest],
    "/v1/completions": [CompletionRequest],
    "/tokenize": [TokenizeRequest],
    "/detokenize": [DetokenizeRequest],
}
POST_PATHS = [route.path for route in ROUTES if route.method == "POST"]


def field_names(path: str) -> list[str]:
    names = {f.name for struct in STRUCTS.get(path, []) for f in msgspec.structs.fields(struct)}
    return sorted(names | set(VALID_BODIES.get(path, {"model": MODEL})) | set(ADVISORY_FIELDS))


NESTED_FIELDS = sorted(
    {f.name for f in msgspec.structs.fields(Message)}
    | {f.name for f in msgspec.structs.fields(ContentPart)}
)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from(HOSTILE_NUMBERS),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(HOSTILE_STRINGS),
)
json_values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(NESTED_FIELDS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)


def nested(depth: int, core: Any) -> Any:
    for i in range(depth):
        core = [core] if i % 2 else {"a": core}
    return core


def deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth  # deeper than the decoder can build as objects


def replace_somewhere(value: Any, choices: list[int], replacement: Any) -> Any:
    """`value` with the node picked by `choices` (one index per level) replaced."""
    if not choices or not isinstance(value, dict | list) or not value:
        return replacement
    if isinstance(value, dict):
        key = list(value)[choices[0] % len(value)]
        return {**value, key: replace_somewhere(value[key], choices[1:], replacement)}
    i = choices[0] % len(value)
    return [*value[:i], replace_somewhere(value[i], choices[1:], replacement), *value[i + 1 :]]


@st.composite
def damaged_bodies(draw: st.DrawFn, path: str) -> bytes:
    body = json.loads(json.dumps(VALID_BODIES.get(path, {"model": MODEL})))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "drop", "node", "deep", "advisory"]))
        if not isinstance(body, dict):  # a "node" action replaced the whole body
            break
        if action == "set":
            body[draw(st.sampled_from(field_names(path)))] = draw(json_values)
        elif action == "drop" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif action == "node":
            choices = draw(st.lists(st.integers(0, 7), min_size=1, max_size=6))
            body = replace_somewhere(body, choices, draw(json_values))
        elif action == "deep":
            depth = draw(st.sampled_from([50, 400, 900, 1500]))
            body[draw(st.sampled_from(field_names(path)))] = nested(depth, draw(leaves))
        else:
            body[draw(st.sampled_from(ADVISORY_FIELDS))] = draw(json_values)
    ascii_only = draw(st.booleans())
    text = json.dumps(body, ensure_ascii=ascii_only)  # NaN/Infinity are not JSON: also fine
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes invalid UTF-8
    damage = draw(st.sampled_from(["none", "none", "truncate", "byte", "duplicate", "deep"]))
    if damage == "truncate":
        raw = raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    elif damage == "byte":
        at = draw(st.integers(0, len(raw)))
        raw = (
            raw[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]))
            + raw[at:]
        )
    elif damage == "duplicate" and raw.startswith(b"{"):
        key = draw(st.sampled_from(field_names(path)))
        raw = (
            b"{"
            + json.dumps(key).encode()
            + b": "
            + json.dumps(draw(json_values)).encode()
            + b", "
            + raw[1:]
        )
    elif damage == "deep" and raw.startswith(b"{"):
        raw = (
            b'{"metadata": '
            + deep_text(draw(st.sampled_from([1200, 20_000]))).encode()
            + b", "
            + raw[1:]
        )
    return raw


# A plain seeded mutator for protocol suites that fuzz one route with their own valid body
# (test_responses_validation.py): replace, drop or duplicate one random node.
ODD_VALUES = [None, True, -1, 0, 2**70, -(2**70), 1e308, -0.5, 3.7, "", "x", "<|im_end|>", [],
              [1, "a"], {}, {"type": "text"}, {"role": "user"}, "\ud7ff\ue000"]  # fmt: skip


def mutate(rng: random.Random, value: Any) -> Any:
    """Replace, drop or duplicate one randomly chosen node of a JSON value."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        choice = rng.random()
        if choice < 0.2:
            del value[key]
        elif choice < 0.5:
            value[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        else:
            value[key] = mutate(rng, value[key])
        return value
    if isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        if rng.random() < 0.3:
            value.append(copy.deepcopy(value[i]))
        else:
            value[i] = mutate(rng, value[i])
        return value
    return copy.deepcopy(rng.choice(ODD_VALUES))  # a shared one could end up inside itself


CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/plain",
                 "application/x-www-form-urlencoded", None]  # fmt: skip


def assert_protocol_answer(path: str, response: httpx.Response, sent: Any) -> None:
    status = response.status_code
    assert status < 500 or status in DOCUMENTED_5XX, (path, sent, response.text[:2000])
    if status < 400:
        return
    body = response.json()
    if path.startswith("/v1/messages"):  # Anthropic: {"type": "error", "error": {type, message}}
        assert body["type"] == "error", body
        assert body["error"]["type"] and body["error"]["message"], body
        return
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, body
    assert error["message"] and error["code"] and error["type"], body


@pytest.fixture(scope="module")
def server():
    running = start_server(FakeEngine(max_context=512))
    client = httpx.Client(base_url=running.base_url, timeout=30)
    yield client
    # After everything below: still healthy, and still answers a normal request.
    assert client.get("/health").json() == {"status": "ok"}
    normal = client.post("/v1/chat/completions", json=VALID_BODIES["/v1/chat/completions"])
    assert normal.status_code == 200, normal.text
    client.close()
    running.stop()


def fuzz_route(client: httpx.Client, path: str, examples: int) -> None:
    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(raw=damaged_bodies(path), content_type=st.sampled_from(CONTENT_TYPES))
    def check(raw: bytes, content_type: str | None) -> None:
        headers = {"content-type": content_type} if content_type else {}
        response = client.post(path, content=raw, headers=headers)
        assert_protocol_answer(path, response, raw[:300])

    check()


@pytest.mark.parametrize("path", POST_PATHS)
def test_damaged_bodies_never_yield_a_server_error(server, path):
    fuzz_route(server, path, CI_EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("path", POST_PATHS)
def test_damaged_bodies_never_yield_a_server_error_long(server, path):
    fuzz_route(server, path, SLOW_EXAMPLES)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH"])
def test_wrong_methods_are_405_in_the_envelope(server, route, method):
    path = re.sub(r"\{[^}]*\}", MODEL, route.path)
    response = server.request(method, path, content=b"{}")
    if any(r.method == method and r.match(path) is not None for r in ROUTES):
        # this route's own method, or another route of that method claims the path too
        # (`GET /v1/responses/{id}` takes `/v1/responses/input_tokens` as an id)
        assert_protocol_answer(path, response, method)
        return
    assert response.status_code == 405, response.text
    assert response.json()["error"]["code"] == "method_not_allowed"


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(path=st.text(alphabet="/abcv1%.?#&=", max_size=30))
def test_unknown_paths_are_404_in_the_envelope(server, path):
    response = server.post("/" + path.lstrip("/"), content=b"{}")
    assert response.status_code in (200, 400, 404, 405), (path, response.text)
    assert_protocol_answer("/" + path, response, path)
