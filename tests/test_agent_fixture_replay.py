"""The recorded mid-session requests of the three agent clients (tests/fixtures/agents),
replayed as they were sent (query string and headers kept) against the Qwen-template stack
over a scripted engine: each is accepted and answered with a complete stream whose tool call
the client can execute. No npm needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ninfer.engine_types import EngineConfig
from ninfer.prompt.builtin_templates import builtin_template
from ninfer.server.config import AppConfig
from scripted_engine import ScriptedEngine
from server_harness import start_server

KEY = "sk-local-test"  # the fixtures' own bearer token
MODEL = "scripted-qwen"
FIXTURES = Path(__file__).parent / "fixtures" / "agents"  # copies of ../shared/fixtures/agents
CALL = (
    "<tool_call>\n<function={name}>\n<parameter={param}>\n{value}\n</parameter>\n"
    "</function>\n</tool_call>"
)


@pytest.fixture(scope="module")
def server():
    engine = ScriptedEngine(["unused"], config=EngineConfig(max_concurrency=2))
    running = start_server(
        engine,
        AppConfig(api_key=KEY),
        chat_template=builtin_template("qwen3_5"),
        model_id=MODEL,
        default_max_tokens=4096,
    )
    yield running
    running.stop()


def replay(server, name: str, turn_text: str) -> tuple[dict, list[str]]:
    fixture = json.loads((FIXTURES / name).read_text())
    method, target = fixture["endpoint"].split(" ", 1)
    body = fixture["body"]
    if not target.startswith("/v1/messages"):
        body["model"] = MODEL
    server.engine.turns = [turn_text]
    headers = {k: v for k, v in fixture["headers"].items() if k.lower() != "content-length"}
    with httpx.stream(
        method, server.base_url + target, json=body, headers=headers, timeout=30
    ) as reply:
        text = reply.read().decode()
        assert reply.status_code == 200, text
    return body, [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_qwen_code_turn3_replay(server):
    call = CALL.format(name="read_file", param="absolute_path", value="/repo/src/app.py")
    _, data = replay(server, "qwen-code-turn3-search-read.json", call)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    calls = [
        c
        for ch in chunks
        for choice in ch["choices"]
        for c in choice["delta"].get("tool_calls") or []
    ]
    assert calls[0]["function"]["name"] == "read_file"
    assert json.loads("".join(c["function"].get("arguments") or "" for c in calls)) == {
        "absolute_path": "/repo/src/app.py"
    }
    finish = [choice["finish_reason"] for ch in chunks for choice in ch["choices"]]
    assert finish[-1] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens"] > 0  # stream_options.include_usage


def test_claude_code_turn3_replay(server):
    call = CALL.format(name="Bash", param="command", value="ls")
    _, data = replay(server, "claude-code-turn3-write-bash.json", call)
    events = [json.loads(d) for d in data]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    tool_use = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert any(b["type"] == "tool_use" and b["name"] == "Bash" for b in tool_use)
    delta = [e for e in events if e["type"] == "message_delta"][-1]
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_codex_turn2_replay(server):
    call = CALL.format(name="exec_command", param="cmd", value="ls")
    _, data = replay(server, "codex-turn2-exec.json", call)
    events = [json.loads(d) for d in data if d != "[DONE]"]
    done = events[-1]
    assert done["type"] == "response.completed", done
    items = done["response"]["output"]
    calls = [i for i in items if i["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("exec_command", {"cmd": "ls"})
    ]
