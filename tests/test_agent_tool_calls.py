"""The tool-call audit the agent-client tests rely on: it reads calls from each protocol's
streamed and plain answers, and it rejects a call that did not parse, names an undeclared
tool, breaks the tool's schema, or was never answered."""

from __future__ import annotations

import json

import jsonschema
import pytest

from agent_tool_calls import CHAT, MESSAGES, RESPONSES, audit_tool_calls, emitted_calls
from asgi_recorder import Exchange, RecordingApp

SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}


def sse(*payloads: dict, done: bool = False) -> bytes:
    text = "".join(f"event: x\ndata: {json.dumps(p)}\n\n" for p in payloads)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


def exchange(path: str, request: dict, response: bytes) -> Exchange:
    recorded = Exchange("POST", path, "", {}, bytearray(json.dumps(request).encode()), 200)
    recorded.response += response
    return recorded


def chat_stream(name: str, arguments: str) -> bytes:
    first = {"index": 0, "id": "call_1", "function": {"name": name, "arguments": ""}}
    rest = {"index": 0, "function": {"arguments": arguments}}
    return sse(
        {"choices": [{"delta": {"tool_calls": [first]}}]},
        {"choices": [{"delta": {"tool_calls": [rest]}}]},
        {"choices": [], "usage": {}},
        done=True,
    )


CHAT_TOOLS = {"tools": [{"type": "function", "function": {"name": "sh", "parameters": SCHEMA}}]}


def recorder_of(*exchanges: Exchange) -> RecordingApp:
    recorder = RecordingApp(None)
    recorder.exchanges.extend(exchanges)
    return recorder


def test_chat_stream_call_answered_in_the_next_request():
    result = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "hi"}]}
    follow_up = {**CHAT_TOOLS, "messages": [result]}
    recorder = recorder_of(
        exchange(CHAT, CHAT_TOOLS, chat_stream("sh", '{"command": "echo hi"}')),
        exchange(CHAT, follow_up, sse({"choices": [{"delta": {"content": "ok"}}]}, done=True)),
    )
    [(call, result)] = audit_tool_calls(recorder, CHAT)
    assert (call.call_id, call.name, call.arguments, result) == (
        "call_1",
        "sh",
        {"command": "echo hi"},
        "hi",
    )


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("rm", '{"command": "x"}', "undeclared"),
        ("sh", '{"command": "x"', "arguments"),
        ("sh", '{"cmd": "x"}', "required"),
    ],
)
def test_a_broken_chat_call_is_reported(name, arguments, error):
    recorder = recorder_of(exchange(CHAT, CHAT_TOOLS, chat_stream(name, arguments)))
    with pytest.raises((AssertionError, jsonschema.ValidationError), match=error):
        audit_tool_calls(recorder, CHAT)


def test_an_unanswered_call_has_no_result():
    recorder = recorder_of(exchange(CHAT, CHAT_TOOLS, chat_stream("sh", '{"command": "x"}')))
    assert [result for _, result in audit_tool_calls(recorder, CHAT)] == [None]


def test_messages_stream_and_plain_body():
    tools = {"tools": [{"name": "Bash", "input_schema": SCHEMA}, {"type": "web_search_x"}]}
    block = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
    start = {"type": "content_block_start", "index": 1, "content_block": block}
    partial = {"type": "input_json_delta", "partial_json": '{"command": "ls"}'}
    delta = {"type": "content_block_delta", "index": 1, "delta": partial}
    streamed = exchange(MESSAGES, tools, sse({"type": "message_start"}, start, delta))
    plain = exchange(MESSAGES, tools, json.dumps({"type": "message", "content": [
        {"type": "text", "text": "x"},
        {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "pwd"}},
    ]}).encode())  # fmt: skip
    answer = {**tools, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
    ]}]}  # fmt: skip
    recorder = recorder_of(streamed, plain, exchange(MESSAGES, answer, sse()))
    audited = audit_tool_calls(recorder, MESSAGES)
    assert [(c.call_id, c.arguments, r) for c, r in audited] == [
        ("toolu_1", {"command": "ls"}, "a.txt"),
        ("toolu_2", {"command": "pwd"}, None),
    ]


def test_responses_function_namespace_and_custom_calls():
    tools = {"tools": [
        {"type": "function", "name": "exec_command", "parameters": SCHEMA},
        {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]},
        {"type": "custom", "name": "apply_patch"},
    ]}  # fmt: skip
    items = [
        {"type": "function_call", "call_id": "c1", "name": "exec_command",
         "arguments": '{"command": "ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "spawn", "namespace": "agents",
         "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** x"},
    ]  # fmt: skip
    streamed = sse(*({"type": "response.output_item.done", "item": i} for i in items))
    calls = emitted_calls(exchange(RESPONSES, tools, streamed))
    assert [(c.name, c.namespace, c.custom) for c in calls] == [
        ("exec_command", None, False),
        ("spawn", "agents", False),
        ("apply_patch", None, True),
    ]
    answer = {**tools, "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    recorder = recorder_of(exchange(RESPONSES, tools, streamed), exchange(RESPONSES, answer, b""))
    assert [r for _, r in audit_tool_calls(recorder, RESPONSES)] == ["ok", None, None]
    spawn_outside = dict(items[1], namespace=None)
    wrong = sse({"type": "response.output_item.done", "item": spawn_outside})
    with pytest.raises(AssertionError, match="undeclared"):
        audit_tool_calls(recorder_of(exchange(RESPONSES, tools, wrong)), RESPONSES)
