"""Every Responses validation error: HTTP status, error code and `param`, never a 500."""

from __future__ import annotations

import copy
import json
import random

import httpx
import openai
import pytest

from responses_harness import MODEL, WEATHER_TOOL, post, start_responses_server

CALL = {
    "type": "function_call",
    "call_id": "call_a",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
}
CALL_B = {**CALL, "call_id": "call_b"}
USER = {"role": "user", "content": "weather"}


def result(call_id: str, **extra):
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny", **extra}


@pytest.fixture(scope="module")
def server():
    running = start_responses_server()
    yield running
    running.stop()


BASE = {"model": MODEL, "input": "hi"}
CASES = [
    # top-level fields
    ({"foo": 1}, "unknown_parameter", "foo"),
    ({"reasoning": {"effort": "low", "foo": 1}}, "unknown_parameter", "reasoning.foo"),
    ({"text": {"colour": "red"}}, "unknown_parameter", "text.colour"),
    ({"model": "other"}, "model_not_found", "model"),
    ({"model": None}, "missing_required_parameter", "model"),
    ({"input": None}, "missing_required_parameter", "input"),
    ({"input": ""}, "invalid_value", "input"),
    ({"input": []}, "invalid_value", "input"),
    ({"input": 5}, "invalid_type", "input"),
    ({"temperature": 2.5}, "invalid_value", "temperature"),
    ({"temperature": "hot"}, "invalid_type", "temperature"),
    ({"top_p": 1.5}, "invalid_value", "top_p"),
    ({"max_output_tokens": -1}, "invalid_value", "max_output_tokens"),
    ({"max_tool_calls": -1}, "invalid_value", "max_tool_calls"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "invalid_value", "metadata"),
    ({"metadata": {"k": "v" * 513}}, "invalid_value", "metadata.k"),
    ({"metadata": {"k": 1}}, "invalid_type", "metadata.k"),
    ({"client_metadata": "x"}, "invalid_type", "client_metadata"),
    ({"reasoning": {"effort": "extreme"}}, "invalid_value", "reasoning.effort"),
    (
        {"reasoning": {"effort": "high"}, "chat_template_kwargs": {"enable_thinking": False}},
        "conflicting_template_option",
        "reasoning.effort",
    ),
    (
        {"preserve_thinking": True, "chat_template_kwargs": {"preserve_thinking": False}},
        "conflicting_template_option",
        "chat_template_kwargs.preserve_thinking",
    ),
    ({"chat_template_kwargs": {"messages": []}}, "invalid_value", "chat_template_kwargs.messages"),
    ({"text": {"format": {"type": "json_object"}}}, "unsupported_parameter", "text.format"),
    ({"text": {"format": {"type": "yaml"}}}, "invalid_value", "text.format.type"),
    ({"text": {"verbosity": "high"}}, "unsupported_parameter", "text.verbosity"),
    ({"truncation": "auto"}, "unsupported_parameter", "truncation"),
    ({"truncation": "sometimes"}, "invalid_value", "truncation"),
    ({"top_logprobs": 3}, "unsupported_parameter", "top_logprobs"),
    ({"service_tier": "flex"}, "unsupported_parameter", "service_tier"),
    ({"background": True}, "unsupported_parameter", "background"),
    ({"include": ["file_search_call.results"]}, "unsupported_parameter", "include[0]"),
    ({"conversation": "conv_1"}, "unsupported_parameter", "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "unsupported_parameter", "prompt"),
    ({"stream_options": {"include_obfuscation": True}}, "invalid_value", "stream_options"),
    ({"prompt_cache_options": {"mode": "x"}}, "invalid_value", "prompt_cache_options.mode"),
    ({"prompt_cache_retention": "1y"}, "invalid_value", "prompt_cache_retention"),
    ({"previous_response_id": "resp_nope"}, "previous_response_not_found", "previous_response_id"),
    ({"input": "x" * 40000}, "context_length_exceeded", "input"),
    # tools and tool_choice
    ({"tools": [{"type": "function"}]}, "invalid_value", "tools[0].name"),
    ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "invalid_value", "tools[1].name"),
    ({"tools": ["get_weather"]}, "invalid_type", "tools[0]"),
    ({"tools": [{"type": "teleport"}]}, "invalid_value", "tools[0].type"),
    ({"tools": [{"type": ["function"]}]}, "invalid_value", "tools[0].type"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": {}}}, "invalid_value", "tool_choice"),
    (
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "allowed_tools", "tools": [{"type": []}]},
        },
        "invalid_value",
        "tool_choice.tools[0].type",
    ),
    ({"input": [{"type": {"x": 1}}]}, "invalid_value", "input[0].type"),
    ({"input": [{"role": ["user"], "content": "x"}]}, "invalid_value", "input[0].role"),
    ({"tools": [{**WEATHER_TOOL, "parameters": []}]}, "invalid_value", "tools[0].parameters"),
    ({"tools": [{**WEATHER_TOOL, "strict": "yes"}]}, "invalid_type", "tools[0].strict"),
    ({"tools": [{"type": "namespace", "name": "ns"}]}, "invalid_value", "tools[0].tools"),
    (
        {"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]},
        "unsupported_parameter",
        "tools[0].tools[0].type",
    ),
    ({"tool_choice": "required"}, "invalid_value", "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "maybe"}, "invalid_value", "tool_choice"),
    (
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
        "invalid_value",
        "tool_choice.name",
    ),
    (
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather", "namespace": "ns"},
        },
        "invalid_value",
        "tool_choice.name",
    ),
    (
        {"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
        "unsupported_parameter",
        "tool_choice.type",
    ),
    (
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "nope"}],
            },
        },
        "invalid_value",
        "tool_choice.tools[0].name",
    ),
    (
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "allowed_tools", "mode": "always", "tools": []},
        },
        "invalid_value",
        "tool_choice.mode",
    ),
    # input Items
    ({"input": ["hi"]}, "invalid_type", "input[0]"),
    ({"input": [{"type": "teleport"}]}, "invalid_value", "input[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "unsupported_parameter", "input[0].type"),
    (
        {"input": [USER, {"type": "compaction_trigger"}]},
        "compaction_not_supported",
        "input[1].type",
    ),
    ({"input": [{"role": "tool", "content": "x"}]}, "invalid_value", "input[0].role"),
    ({"input": [{"role": "user"}]}, "missing_required_parameter", "input[0].content"),
    ({"input": [{"role": "user", "content": 3}]}, "invalid_type", "input[0].content"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        "missing_required_parameter",
        "input[0].content[0].text",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
        "invalid_value",
        "input[0].content[0].type",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
        "vision_disabled",
        "input[0].content[0].type",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
        "unsupported_parameter",
        "input[0].content[0].file_id",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "unsupported_parameter",
        "input[0].content[0].type",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "x", "prompt_cache_breakpoint": {}}],
                }
            ]
        },
        "invalid_value",
        "input[0].content[0].prompt_cache_breakpoint",
    ),
    ({"input": [USER, {**CALL, "arguments": "{nope"}]}, "invalid_value", "input[1].arguments"),
    ({"input": [USER, {**CALL, "arguments": "[1]"}]}, "invalid_value", "input[1].arguments"),
    ({"input": [USER, {**CALL, "arguments": {}}]}, "invalid_type", "input[1].arguments"),
    (
        {"input": [USER, {k: v for k, v in CALL.items() if k != "call_id"}]},
        "missing_required_parameter",
        "input[1].call_id",
    ),
    (
        {"input": [USER, {**CALL, "status": "in_progress"}]},
        "unsupported_parameter",
        "input[1].status",
    ),
    ({"input": [USER, CALL, result("call_x")]}, "invalid_tool_history", "input[2].call_id"),
    ({"input": [USER, result("call_a")]}, "invalid_tool_history", "input[1].call_id"),
    (
        {"input": [USER, CALL, result("call_a"), result("call_a")]},
        "invalid_tool_history",
        "input[3].call_id",
    ),
    ({"input": [USER, CALL, CALL_B, result("call_b")]}, "invalid_tool_history", "input[3]"),
    (
        {"input": [USER, CALL, result("call_a", name="other")]},
        "invalid_tool_history",
        "input[2].name",
    ),
    (
        {"input": [USER, CALL, {"type": "function_call_output", "call_id": "call_a"}]},
        "missing_required_parameter",
        "input[2].output",
    ),
    (
        {"input": [USER, CALL, {**result("call_a"), "output": []}]},
        "invalid_value",
        "input[2].output",
    ),
    (
        {
            "input": [
                USER,
                CALL,
                {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "x"}]},
            ]
        },
        "invalid_assistant_history",
        "input[2]",
    ),
    (
        {"input": [USER, CALL, {"role": "assistant", "content": "late"}]},
        "invalid_assistant_history",
        "input[2]",
    ),
    (
        {
            "input": [
                USER,
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
            ]
        },
        "unsupported_parameter",
        "input[1].content",
    ),
    (
        {"input": [USER, {"type": "reasoning", "content": [{"type": "text", "text": "s"}]}]},
        "invalid_value",
        "input[1].content[0].type",
    ),
    (
        {"input": [{**USER, "id": "msg_1"}, {**USER, "id": "msg_1"}]},
        "invalid_value",
        "input[1].id",
    ),
    ({"input": [{**USER, "id": 7}]}, "invalid_type", "input[0].id"),
    ({"input": [{"role": "developer", "content": "rules"}]}, "invalid_prompt", "input"),
]


@pytest.mark.parametrize(("patch", "code", "param"), CASES)
def test_create_validation(server, patch, code, param):
    body = {**BASE, **patch}
    body = {k: v for k, v in body.items() if v is not None}
    reply = post(server, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == "invalid_request_error" and error["message"]
    assert reply.headers["x-request-id"]


def test_streamed_requests_fail_validation_before_the_stream(server):
    reply = post(server, {**BASE, "stream": True, "temperature": 9})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "temperature"


def test_sdk_raises_with_code_and_param(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="hi", extra_body={"frobnicate": True})
    assert (info.value.code, info.value.param) == ("unknown_parameter", "frobnicate")


def test_bad_json_and_input_tokens_errors(server):
    raw = httpx.post(server.base_url + "/v1/responses", content=b"{nope")
    assert (raw.status_code, raw.json()["error"]["code"]) == (400, "invalid_json")
    for body, code, param in [
        ({"input": "hi", "stream": True}, "unknown_parameter", "stream"),
        ({"model": "other", "input": "hi"}, "model_not_found", "model"),
        ({"input": [{"type": "teleport"}]}, "invalid_value", "input[0].type"),
    ]:
        reply = post(server, body, "/v1/responses/input_tokens")
        assert reply.status_code == 400, reply.text
        assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == (code, param)


def test_resource_errors(server):
    base = server.base_url + "/v1/responses"
    missing = httpx.get(base + "/resp_nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "response_not_found"
    assert httpx.delete(base + "/resp_nope").status_code == 404
    assert httpx.get(base + "/resp_nope/input_items").status_code == 404
    stored = post(server, BASE).json()["id"]
    for query, param in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("order=sideways", "order"),
        ("after=msg_unknown", "after"),
    ]:
        reply = httpx.get(f"{base}/{stored}/input_items?{query}")
        assert reply.status_code == 400, query
        assert reply.json()["error"]["param"] == param
    for query, param in [("stream=true", "stream"), ("include[]=x", "include[]")]:
        reply = httpx.get(f"{base}/{stored}?{query}")
        assert reply.status_code == 400
        assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == (
            "unsupported_parameter",
            param,
        )
    assert httpx.put(base).status_code == 405


FUZZ_VALID = {
    "model": MODEL,
    "instructions": "Be brief.",
    "input": [
        {"type": "message", "id": "msg_1", "role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "weather"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {**CALL, "namespace": "ns"},
        {**result("call_a"), "output": [{"type": "input_text", "text": "sunny"}]},
        {"role": "user", "content": "again"},
    ],
    "tools": [
        WEATHER_TOOL,
        {"type": "namespace", "name": "ns", "tools": [WEATHER_TOOL]},
        {"type": "custom", "name": "apply_patch"},
        {"type": "web_search"},
    ],
    "tool_choice": {"type": "function", "name": "get_weather", "namespace": "ns"},
    "reasoning": {"effort": "low", "summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "metadata": {"a": "b"},
    "max_output_tokens": 8,
    "temperature": 0.5,
    "store": True,
}


def test_random_damage_never_yields_a_server_error(server):
    from test_server_fuzz import mutate

    assert post(server, FUZZ_VALID).status_code == 200, post(server, FUZZ_VALID).text
    rng = random.Random(20261201)
    with httpx.Client(timeout=10) as client:
        for _ in range(300):
            body = mutate(rng, copy.deepcopy(FUZZ_VALID))
            for _ in range(rng.randint(0, 2)):
                body = mutate(rng, body)
            reply = client.post(server.base_url + "/v1/responses", content=json.dumps(body))
            assert reply.status_code < 500, (body, reply.text)
            if reply.status_code != 200:
                error = reply.json()["error"]
                assert error["message"] and error["code"], (body, error)


@pytest.mark.parametrize(
    ("patch", "shown"),
    [
        ({"service_tier": "flex"}, "`flex`"),
        ({"include": ["message.output_text.logprobs"]}, "`message.output_text.logprobs`"),
        ({"text": {"verbosity": "high"}}, "`high`"),
        ({"tools": [{"type": "telep\u00f6rt"}]}, "`telep\\xf6rt`"),
        ({"metadata": {"k": "v" * 600}}, "600 characters"),
        ({"tools": [{"type": "mcp"}], "tool_choice": {"type": "mcp"}}, "`mcp`"),
    ],
)
def test_rejections_name_the_value(server, patch, shown):
    reply = post(server, {**BASE, **patch})
    assert reply.status_code == 400
    assert shown in reply.json()["error"]["message"]
