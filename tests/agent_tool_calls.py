"""The tool calls the server emitted to an agent client, read back from recorded exchanges, and
the checks every such call must pass: it parsed, it names a tool the request declared, its
arguments are valid against that tool's schema, and the client answered it (a later request
carries a result for the same call id).

One reader per protocol the clients speak: Chat Completions (Qwen Code), Anthropic Messages
(Claude Code) and Responses (Codex). Each reads streamed answers (SSE events) and plain JSON
bodies alike, so the checks hold whatever the client asked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from asgi_recorder import Exchange, RecordingApp

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"


@dataclass(frozen=True)
class EmittedCall:
    call_id: str
    name: str
    arguments: Any  # the decoded arguments (a dict), or the raw text of a custom tool's input
    namespace: str | None = None
    custom: bool = False  # a Responses custom (free-form) tool: its input is plain text


def emitted_calls(exchange: Exchange) -> list[EmittedCall]:
    """The calls in the server's answer to `exchange`, in output order."""
    events = exchange.events()
    if exchange.path == CHAT:
        return _chat_calls(events)
    if exchange.path == MESSAGES:
        return _messages_calls(events)
    if exchange.path == RESPONSES:
        return _responses_calls(events)
    raise ValueError(f"no tool-call reader for {exchange.path}")


def _chat_calls(events: list[Any]) -> list[EmittedCall]:
    parts: dict[int, dict[str, str]] = {}
    for event in events:
        for choice in event.get("choices") or []:
            message = choice.get("message") or choice.get("delta") or {}
            for position, call in enumerate(message.get("tool_calls") or []):
                part = parts.setdefault(call.get("index", position), {"arguments": ""})
                function = call.get("function") or {}
                for key in ("id", "name"):
                    value = call.get(key) if key == "id" else function.get(key)
                    if value:
                        part[key] = value
                part["arguments"] += function.get("arguments") or ""
    return [
        EmittedCall(p.get("id", ""), p.get("name", ""), _decoded(p["arguments"]))
        for _, p in sorted(parts.items())
    ]


def _messages_calls(events: list[Any]) -> list[EmittedCall]:
    if len(events) == 1 and events[0].get("type") == "message":  # not streamed
        return [
            EmittedCall(b["id"], b["name"], b["input"])
            for b in events[0]["content"]
            if b["type"] == "tool_use"
        ]
    blocks: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.get("type") == "content_block_start":
            block = event["content_block"]
            if block["type"] == "tool_use":
                blocks[event["index"]] = {**block, "json": ""}
        elif event.get("type") == "content_block_delta" and event["index"] in blocks:
            blocks[event["index"]]["json"] += event["delta"].get("partial_json", "")
    calls = []
    for _, block in sorted(blocks.items()):
        arguments = _decoded(block["json"]) if block["json"] else block.get("input")
        calls.append(EmittedCall(block["id"], block["name"], arguments))
    return calls


def _responses_calls(events: list[Any]) -> list[EmittedCall]:
    items: list[dict[str, Any]] = []
    for event in events:
        if event.get("object") == "response":  # not streamed
            items = event.get("output") or []
        elif event.get("type") == "response.output_item.done":
            items.append(event["item"])
    calls = []
    for item in items:
        if item.get("type") == "function_call":
            calls.append(
                EmittedCall(
                    item["call_id"],
                    item["name"],
                    _decoded(item["arguments"]),
                    item.get("namespace"),
                )
            )
        elif item.get("type") == "custom_tool_call":
            calls.append(EmittedCall(item["call_id"], item["name"], item["input"], custom=True))
    return calls


class _Unparsed(str):
    """Arguments text that is not JSON (the check reports it)."""


def _decoded(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _Unparsed(text)


def declared_tools(path: str, body: dict[str, Any]) -> dict[tuple[str | None, str], Any]:
    """(namespace, name) -> the declared argument schema (None: no schema, any object;
    "custom": a free-form tool), for the tools in a request body."""
    declared: dict[tuple[str | None, str], Any] = {}
    for tool in body.get("tools") or []:
        if path == CHAT:
            function = tool.get("function") or {}
            declared[None, function.get("name")] = function.get("parameters")
        elif path == MESSAGES:
            if "input_schema" in tool:  # server tools (web search, ...) have a `type` instead
                declared[None, tool["name"]] = tool["input_schema"]
        elif tool.get("type") == "function":
            declared[None, tool["name"]] = tool.get("parameters")
        elif tool.get("type") == "custom":
            declared[None, tool["name"]] = "custom"
        elif tool.get("type") == "namespace":
            for member in tool.get("tools") or []:
                declared[tool["name"], member["name"]] = member.get("parameters")
    return declared


def check_call(call: EmittedCall, declared: dict[tuple[str | None, str], Any]) -> None:
    """The call parsed, names a declared tool, and its arguments fit that tool's schema."""
    key = (call.namespace, call.name)
    assert key in declared, f"call to an undeclared tool {key}: {sorted(map(str, declared))}"
    assert call.call_id, f"call to {call.name} without an id"
    schema = declared[key]
    if schema == "custom" or call.custom:
        assert schema == "custom" and call.custom, f"{call.name}: custom/function mismatch"
        assert isinstance(call.arguments, str), call
        return
    assert not isinstance(call.arguments, _Unparsed), f"{call.name}: arguments {call.arguments!r}"
    assert isinstance(call.arguments, dict), f"{call.name}: arguments are not an object"
    if schema:
        jsonschema.validate(call.arguments, schema)


def tool_results(path: str, body: dict[str, Any]) -> dict[str, str]:
    """call id -> the text of the tool result a request body carries for it."""
    results: dict[str, str] = {}
    if path == CHAT:
        for message in body.get("messages") or []:
            if message.get("role") == "tool":
                results[message["tool_call_id"]] = _text(message.get("content"))
    elif path == MESSAGES:
        for message in body.get("messages") or []:
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_result":
                    results[block["tool_use_id"]] = _text(block.get("content"))
    else:
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                results[item["call_id"]] = _text(item.get("output"))
    return results


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    return "" if content is None else json.dumps(content)


def audit_tool_calls(recorder: RecordingApp, path: str) -> list[tuple[EmittedCall, str | None]]:
    """Checks every call the server emitted on `path` (check_call, against the tools of the
    request it answered) and pairs it with the result text a later request carried for it
    (None when no later request did: the client ended there)."""
    exchanges = [e for e in recorder.posts(path) if e.status == 200]
    audited = []
    for position, exchange in enumerate(exchanges):
        declared = declared_tools(path, exchange.json())
        for call in emitted_calls(exchange):
            check_call(call, declared)
            answer = None
            for later in exchanges[position + 1 :]:
                results = tool_results(path, later.json())
                if call.call_id in results:
                    answer = results[call.call_id]
                    break
            audited.append((call, answer))
    return audited
