"""Stopping `ninfer-serve`: Ctrl+C twice, SIGTERM at once, one Ctrl+C before it is ready."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ninfer.server.stopping import StopSignals
from server_harness import free_port

HERE = Path(__file__).resolve().parent
MODEL = "fake-chat"
LONG_STREAM = {
    "model": MODEL,
    "stream": True,
    "messages": [{"role": "user", "content": "long: x"}],
}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


class ServerProcess:
    def __init__(self, *flags: str, warmup_s: float = 0.0) -> None:
        self.port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "python"), str(HERE)])
        env["FAKE_WARMUP_S"] = str(warmup_s)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "fake_serve.py"), "--port", str(self.port), *flags],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for_log(self, text: str, seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"no {text!r} in the log:\n{self.log()}")

    def wait_ready(self) -> None:
        self.wait_for_log("ready: serving")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.02)
        raise AssertionError(f"not serving:\n{self.log()}")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, seconds: float) -> int:
        code = self.proc.wait(seconds)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def server_process():
    started: list[ServerProcess] = []

    def start(*flags: str, warmup_s: float = 0.0) -> ServerProcess:
        process = ServerProcess(*flags, warmup_s=warmup_s)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def answers(server: ServerProcess) -> bool:
    reply = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=5,
    )
    return reply.status_code == 200 and "You said: hi." in reply.text


def test_one_ctrl_c_only_prompts_and_serving_continues(server_process):
    server = server_process("--log-level", "info")
    server.wait_ready()
    server.signal(signal.SIGINT)
    server.wait_for_log("Press Ctrl+C again within 5 s to close")
    assert any("WARNING" in line and "Press Ctrl+C again" in line for line in server.lines)
    assert answers(server)
    time.sleep(5.3)  # the window passes: a later single press prompts again, no stop
    server.signal(signal.SIGINT)
    time.sleep(0.5)
    assert server.proc.poll() is None
    assert answers(server)
    assert sum("Press Ctrl+C again" in line for line in server.lines) == 2
    assert "server stopped" not in server.log()


def test_two_ctrl_c_stop_the_server_and_end_a_running_stream(server_process):
    server = server_process()
    server.wait_ready()
    stream_lines: list[str] = []
    first_data = threading.Event()

    def stream() -> None:
        with httpx.stream(
            "POST", server.base_url + "/v1/chat/completions", json=LONG_STREAM, timeout=15
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    stream_lines.append(line)
                    first_data.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first_data.wait(10)
    server.signal(signal.SIGINT)
    server.wait_for_log("Press Ctrl+C again")
    server.signal(signal.SIGINT)
    assert server.wait_exit(10) == 0
    reader.join(10)
    log = server.log()
    assert "server stopped" in log.splitlines()[-1], log
    last = json.loads(stream_lines[-1][6:])
    assert last["error"]["code"] == "service_unavailable"
    assert "data: [DONE]" not in stream_lines
    with pytest.raises(httpx.TransportError):  # the listener is gone: connections refused
        httpx.get(server.base_url + "/health", timeout=1)


def test_sigterm_stops_at_once(server_process):
    server = server_process()
    server.wait_ready()
    started = time.monotonic()
    server.signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert time.monotonic() - started < 5
    assert "server stopped" in server.log()
    assert "Press Ctrl+C again" not in server.log()


def test_one_ctrl_c_before_ready_ends_startup(server_process):
    server = server_process(warmup_s=30)
    server.wait_for_log("loading")
    time.sleep(0.3)  # inside the (slow) warm-up
    started = time.monotonic()
    server.signal(signal.SIGINT)
    assert server.wait_exit(10) == 130
    assert time.monotonic() - started < 5
    assert "startup interrupted" in server.log()
    assert "ready: serving" not in server.log()


class FakeConsole(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_interactive_prompt_on_the_bottom_line_then_erased():
    async def scenario() -> tuple[str, list[str], list[int]]:
        console = FakeConsole()
        stops: list[str] = []
        exits: list[int] = []
        signals = StopSignals(
            asyncio.get_running_loop(),
            lambda: stops.append("stop"),
            lambda: True,
            window_s=0.05,
            console=console,
            exit_now=exits.append,
        )
        signals.interrupt()
        shown = console.getvalue()
        await asyncio.sleep(0.15)  # the window passes: the prompt is erased, no stop
        assert stops == [] and console.getvalue() == shown + "\r\x1b[K"
        signals.interrupt()
        signals.interrupt()  # within the window: stop
        signals.interrupt()  # while stopping: exit at once
        return shown, stops, exits

    shown, stops, exits = asyncio.run(scenario())
    assert shown == "\r\x1b[KPress Ctrl+C again within 0.05 s to close"
    assert stops == ["stop"]
    assert exits == [130]


def test_sigterm_needs_no_confirmation_and_before_ready_one_press_stops():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        stops: list[str] = []
        term = StopSignals(loop, lambda: stops.append("term"), lambda: True, console=io.StringIO())
        term.terminate()
        term.terminate()
        early = StopSignals(loop, lambda: stops.append("early"), lambda: False)
        early.interrupt()
        assert early.stopped_before_ready and not term.stopped_before_ready
        assert stops == ["term", "early"]

    asyncio.run(scenario())
