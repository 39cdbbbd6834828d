"""A live server for the Responses tests: the fake engine with the Qwen3.5/3.6 template,
replying with scripted raw text (reasoning and tool-call markup), one byte-token per event."""

from __future__ import annotations

import json
from typing import Any

import httpx

from fake_engine import FakeEngine
from ninfer.engine_types import EngineConfig
from ninfer.prompt.builtin_templates import builtin_template
from server_harness import RunningServer, start_server

MODEL = "fake-chat"
QWEN = builtin_template("qwen3_5")

REASONED = "Let me think.\n</think>\n\nThe answer is 4."
WEATHER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
TOOL_REPLY = "I should look it up.\n</think>\n\nChecking." + WEATHER_CALL
TWO_CALLS = (
    "Two places.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
)
NAMESPACED_REPLY = (
    "Delegate.\n</think>\n\n<tool_call>\n<function=multi_agent_v1__spawn_agent>\n"
    "<parameter=task>\nread the docs\n</parameter>\n</function>\n</tool_call>"
)
PATCH_REPLY = (
    "Edit it.\n</think>\n\n<tool_call>\n<function=apply_patch>\n<parameter=input>\n"
    "*** Begin Patch\n*** End Patch\n</parameter>\n</function>\n</tool_call>"
)
SUNNY = "<tool_response>\nsunny, 21 C\n</tool_response>"
SCRIPT = {
    "reason": REASONED,
    "weather": TOOL_REPLY,
    "two cities": TWO_CALLS,
    "delegate": NAMESPACED_REPLY,
    "patch": PATCH_REPLY,
    SUNNY: "It is sunny.\n</think>\n\nParis is sunny at 21 C.",
    # the Codex fixture's tool result
    '<tool_response>\nProcess exited with code 0\nOutput:\n22.11.0\n14:    "node": ">=22"\n'
    "</tool_response>": "Found it.\n</think>\n\nThe project pins Node 22.11.0.",
}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather forecast",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
NAMESPACE_TOOL = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
        }
    ],
}
PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
}


def start_responses_server(**served_kwargs: Any) -> RunningServer:
    engine = FakeEngine(EngineConfig(max_concurrency=4, max_pending_requests=8), max_context=32768)
    engine.scripted.update(SCRIPT)
    return start_server(engine, chat_template=QWEN, **served_kwargs)


def tokens(text: str) -> int:
    return len(text.encode())  # the fake tokenizer: one token per byte


def last_prompt(server: RunningServer) -> str:
    return FakeEngine().tokenizer.decode(server.engine.requests[-1].prompt_ids)


def post(
    server: RunningServer, body: dict[str, Any], path: str = "/v1/responses"
) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=30)


def sse_frames(server: RunningServer, body: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    """Every frame of a Responses stream as {"event", "data"}; asserts SSE framing."""
    frames: list[dict[str, Any]] = []
    with httpx.stream(
        "POST",
        server.base_url + "/v1/responses",
        json={**body, "stream": True},
        timeout=30,
        **kwargs,
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                assert line != "data: [DONE]"
                frames.append({"event": event, "data": json.loads(line[len("data: ") :])})
                event = None
    return frames
