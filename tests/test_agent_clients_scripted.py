"""Claude Code, Codex CLI and Qwen Code, installed from npm, complete a tool-using task against
the real HTTP, protocol, template and output-parsing stack over a scripted engine.

The engine plays raw model text per agent turn (tests/scripted_engine.py): Qwen XML calls to
the client's own tools, then a final answer. Each test checks what the client did (the file
its tool wrote, the command it ran, the final text it printed) and what the engine was given
(the tool results, rendered into the next turn's prompt) and what the HTTP layer received (the
client's own tool-result shape, pointing at the call id the server issued; every status).

The clients come from the npm registry (tests/agent_clients.py caches them); without npm or
the registry these tests fail, saying so. Deselect them with `-m "not agent_clients"`.
"""

from __future__ import annotations

import pytest

import agent_clients
from agent_clients import API_KEY, AgentClient, ClientUnavailable, run_client
from agent_tool_calls import audit_tool_calls
from asgi_recorder import RecordingApp
from ninfer.engine_types import EngineConfig
from ninfer.prompt.builtin_templates import builtin_template
from ninfer.server.config import AppConfig
from scripted_engine import ScriptedEngine
from server_harness import start_server

pytestmark = pytest.mark.agent_clients

MODEL = "scripted-qwen"
FINAL = "All done: the script ran to its end."


def call(function: str, **parameters: str) -> str:
    """A Qwen XML tool call, as the model writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters.items())
    return f"<tool_call>\n<function={function}>\n{body}</function>\n</tool_call>"


@pytest.fixture(scope="module")
def engine():
    return ScriptedEngine([FINAL], config=EngineConfig(max_concurrency=4, max_pending_requests=8))


@pytest.fixture(scope="module")
def recorder():
    return RecordingApp(None)


@pytest.fixture(scope="module")
def server(engine, recorder):
    def wrap(app):
        recorder.app = app
        return recorder

    running = start_server(
        engine,
        AppConfig(api_key=API_KEY),
        wrap=wrap,
        chat_template=builtin_template("qwen3_5"),
        model_id=MODEL,
        default_max_tokens=4096,
    )
    yield running
    running.stop()


@pytest.fixture
def script(engine, recorder):
    """Set this test's turns; the prompts and exchanges recorded start empty."""

    def play(*turns: str) -> ScriptedEngine:
        engine.turns = list(turns)
        engine.prompts.clear()
        recorder.exchanges.clear()
        return engine

    return play


def installed(client: AgentClient) -> str:
    try:
        return str(agent_clients.install(client))
    except ClientUnavailable as error:
        pytest.fail(f"{client.name} could not be installed: {error}", pytrace=False)


def finished(done, expected_text: str) -> None:
    report = f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
    report += f"stderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    assert expected_text in done.stdout, report


def tool_result_reached(engine: ScriptedEngine, turn: int, text: str) -> None:
    """The prompt of agent turn `turn` carries the tool result that contains `text`."""
    prompts = engine.tool_prompts()
    assert len(prompts) > turn, f"only {len(prompts)} agent turns reached the engine"
    results = prompts[turn].split("<tool_response>")[1:]
    assert len(results) == turn, results
    assert text in results[-1], results[-1]


def all_answered(recorder: RecordingApp) -> None:
    failed = [(e.method, e.path, e.status) for e in recorder.exchanges if e.status != 200]
    assert not failed, failed


def every_call_answered(recorder: RecordingApp, path: str, names: list[str]) -> None:
    """The server emitted exactly the scripted calls, each well formed against the tools of
    its request, and the client sent a result back for each one."""
    audited = audit_tool_calls(recorder, path)
    assert [call.name for call, _ in audited] == names, audited
    unanswered = [call for call, result in audited if result is None]
    assert not unanswered, unanswered


def agent_bodies(recorder: RecordingApp, path: str) -> list[dict]:
    """The request bodies that carried tools (agent turns, not side requests)."""
    return [body for e in recorder.posts(path) if (body := e.json()).get("tools")]


def test_claude_code_writes_a_file_then_runs_a_command(server, script, recorder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    target = work / "notes.txt"
    engine = script(
        call("Write", file_path=str(target), content="hello from ninfer"),
        call("Bash", command="wc -c notes.txt > size.txt", description="Count the bytes"),
        FINAL,
    )
    claude = installed(agent_clients.CLAUDE_CODE)
    env = agent_clients.claude_code_env(tmp_path / "home", server.base_url)
    done = run_client(
        [claude, "-p", "Write notes.txt, then count its bytes.", "--allowedTools", "Write,Bash"],
        env,
        work,
    )
    finished(done, FINAL)
    assert target.read_text().rstrip("\n") == "hello from ninfer"
    assert (work / "size.txt").read_text().split()[0] == str(len(target.read_bytes()))
    tool_result_reached(engine, 1, str(target))  # "File created successfully at: ..."
    assert "notes.txt" in engine.tool_prompts()[2]  # the Bash call is in the history
    all_answered(recorder)
    every_call_answered(recorder, "/v1/messages", ["Write", "Bash"])
    second = agent_bodies(recorder, "/v1/messages")[1]
    calls = [b for b in second["messages"][-2]["content"] if b["type"] == "tool_use"]
    results = [b for b in second["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert [c["name"] for c in calls] == ["Write"]
    assert calls[0]["input"] == {"file_path": str(target), "content": "hello from ninfer"}
    assert [r["tool_use_id"] for r in results] == [calls[0]["id"]]


def test_qwen_code_writes_a_file_then_runs_a_command(server, script, recorder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    target = work / "notes.txt"
    engine = script(
        call("write_file", file_path=str(target), content="hello from ninfer"),
        # The trailing sleep keeps the command alive while Qwen Code's PTY reader drains the
        # output: a command that exits at once can lose it ("Output: (empty)", seen in CI).
        call("run_shell_command", command="cat notes.txt | tr a-z A-Z; sleep 1"),
        FINAL,
    )
    qwen = installed(agent_clients.QWEN_CODE)
    env = agent_clients.qwen_code_env(tmp_path / "home", server.base_url, MODEL)
    done = run_client([qwen, "-p", "Write notes.txt, then shout it.", "--yolo"], env, work)
    finished(done, FINAL)
    assert target.read_text().rstrip("\n") == "hello from ninfer"
    tool_result_reached(engine, 1, str(target))
    tool_result_reached(engine, 2, "HELLO FROM NINFER")  # the command's output came back
    all_answered(recorder)
    every_call_answered(recorder, "/v1/chat/completions", ["write_file", "run_shell_command"])
    third = agent_bodies(recorder, "/v1/chat/completions")[2]
    assert third["stream"] is True
    calls = [c for m in third["messages"] for c in m.get("tool_calls") or []]
    results = [m for m in third["messages"] if m["role"] == "tool"]
    assert [c["function"]["name"] for c in calls] == ["write_file", "run_shell_command"]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]


def test_codex_runs_commands(server, script, recorder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    engine = script(
        call("exec_command", cmd="printf 'codex was here' > proof.txt"),
        call("exec_command", cmd="cat proof.txt | rev"),
        FINAL,
    )
    codex = installed(agent_clients.CODEX)
    env = agent_clients.codex_env(tmp_path / "home", server.base_url, MODEL)
    done = run_client(
        [
            codex,
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "Write proof.txt, then read it backwards.",
        ],
        env,
        work,
    )
    finished(done, FINAL)
    assert (work / "proof.txt").read_text() == "codex was here"
    tool_result_reached(engine, 1, "Process exited with code 0")
    tool_result_reached(engine, 2, "ereh saw xedoc")
    all_answered(recorder)
    every_call_answered(recorder, "/v1/responses", ["exec_command", "exec_command"])
    third = agent_bodies(recorder, "/v1/responses")[2]
    items = third["input"]
    calls = [i for i in items if i.get("type") == "function_call"]
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [c["name"] for c in calls] == ["exec_command", "exec_command"]
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls]
