"""A fatal device error ends `ninfer-serve`, while out of memory stays a per-request error.

The CPU backend has no CUDA to fail, so the error comes from the core's test hook
(`inject_device_fault`, armed in a server by NINFER_TEST_DEVICE_FAULT_AFTER_STEPS): the model
step fails with the DeviceFatalError a CUDA illegal address raises, through the same catch
as a real one. The server must log the error, answer the requests in flight in their
protocol's envelope (503, or an error event on a started stream), write no terminal request
log records for them (as after a crash), and exit non-zero so that a supervisor restarts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ninfer.server.device_failure import (
    DEVICE_FAILURE_EXIT_STATUS,
    TEST_HOOK_AT_REQUEST_ENV,
    TEST_HOOK_ENV,
)
from server_harness import free_port
from test_server_stop import ServerProcess

pytest.importorskip("ninfer._core")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402
from ninfer.engine_types import EngineConfig, EngineUnavailable, GenerationRequest  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL = "tiny-llama"
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
# The fault is armed when the second request is submitted (it then waits behind the stream
# for the only lane) and fires a few steps later. The stream is long enough that it cannot
# end before a starved test client submits that request.
FAULT_AFTER_STEPS = 5
STREAM_TOKENS = 30000

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return make_random_artifact(
        LLAMA, tmp_path_factory.mktemp("art") / "tiny.ninfer", seed=5, name=MODEL
    )


def test_the_engine_stops_and_reports_the_device_failure(artifact):
    import asyncio

    async def run() -> None:
        engine = AsyncEngine.open(artifact, EngineConfig(max_concurrency=1, max_context=256))
        try:
            assert engine.device_failure is None
            engine._core.inject_device_fault(1)  # the second step fails
            handle = engine.submit(
                GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=50, ignore_eos=True)
            )
            events = [event async for event in handle]
            assert len(events[0].token_ids) == 1  # the prefill step ran
            last = events[-1]
            assert last.finish_reason == "error"
            assert last.error.startswith("device failure: CUDA_CHECK(")
            assert "cudaErrorIllegalAddress" in last.error
            assert engine.device_failure.startswith("CUDA_CHECK(")
            assert not engine.healthy
            with pytest.raises(EngineUnavailable):
                engine.submit(GenerationRequest(prompt_ids=[1], max_tokens=2))
        finally:
            await engine.close()

    asyncio.run(run())


class _RealServer(ServerProcess):
    """`python -m ninfer.server` on the CPU backend (ServerProcess's reading and waiting)."""

    def __init__(self, artifact: Path, *flags: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ninfer.server",
                str(artifact),
                "--port",
                str(self.port),
                "--device",
                "cpu",
                *flags,
            ],  # fmt: skip
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def _stream(base_url: str, lines: list[str], started: threading.Event) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": STREAM_TOKENS,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "go"}],
    }
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                started.set()


def test_a_fatal_device_error_ends_the_server(artifact, tmp_path):
    log_path = tmp_path / "requests.jsonl"
    server = _RealServer(
        artifact, "--max-concurrency", "1", "--max-context", "32768",
        "--request-log-jsonl", str(log_path), "--log-stats-panel", "off",
        env={TEST_HOOK_ENV: str(FAULT_AFTER_STEPS), TEST_HOOK_AT_REQUEST_ENV: "2"},
    )  # fmt: skip
    try:
        server.wait_ready()
        lines: list[str] = []
        started = threading.Event()
        streaming = threading.Thread(target=_stream, args=(server.base_url, lines, started))
        streaming.start()
        assert started.wait(20), server.log()
        queued = httpx.post(  # waits behind the stream for the only lane
            server.base_url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        failed_at = time.monotonic()
        streaming.join(20)
        status = server.wait_exit(15)
        assert time.monotonic() - failed_at < 12
    finally:
        server.kill()

    assert status == DEVICE_FAILURE_EXIT_STATUS, server.log()
    assert queued.status_code == 503
    assert queued.json()["error"]["code"] == "service_unavailable"
    error = json.loads(lines[-1][len("data: ") :])  # the stream's last event, never [DONE]
    assert error["error"]["code"] == "service_unavailable"
    assert "CUDA" not in error["error"]["message"]  # the device error stays in the log
    stderr = server.log()
    fatal = [line for line in stderr.splitlines() if " CRITICAL engine | CUDA_CHECK(" in line]
    assert len(fatal) == 1 and "cudaErrorIllegalAddress" in fatal[0], stderr
    assert "server stopped" in stderr
    records = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    events = [record["event"] for record in records]
    assert events.count("request_start") == 2
    # As after a crash: the requests in flight have no terminal record.
    assert "request_done" not in events and "request_error" not in events
