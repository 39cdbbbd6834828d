"""The session statistics panel: its aggregates, and the live panel on a real terminal (tmux)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ninfer.server.session_stats import RequestSample, SessionStats
from ninfer.server.stats_panel import WIDTH, panel_wanted, render_rows
from server_harness import free_port

HERE = Path(__file__).resolve().parent


def _sample(ttft: float, prompt: int, decode_tokens: int, share: float, wall: float):
    return RequestSample(ttft, prompt, 0, 0.5, decode_tokens, share, wall)


def test_rows_divide_summed_tokens_by_summed_seconds():
    session = SessionStats()
    session.add_completed(_sample(0.1, 100, 10, 1.0, 1.0))  # alone: 10 tok/s
    session.add_completed(_sample(0.3, 300, 30, 1.0, 2.0))  # shared its rounds with one other
    total = session.all_time
    assert total.mean_ttft_s == pytest.approx(0.2)
    assert total.prefill_rate == pytest.approx(400 / 1.0)
    assert total.decode_rate == pytest.approx(40 / 2.0)
    assert total.mean_batch == pytest.approx(3.0 / 2.0)  # duration-weighted rounds
    lines = render_rows(session, (1, 2))
    assert lines[0] == "2 done, 0 failed, 0 cancelled, 0 rejected | 1 running, 2 waiting"
    assert all(len(line) == WIDTH for line in lines[1:])
    assert lines[1].split() == ["TTFT", "cached", "prefill", "decode", "batch"]
    assert "200 ms" in lines[2] and "0/400" in lines[2] and "20.0 tok/s" in lines[2]
    assert session.last_ten() is None and len(lines) == 3


def test_drafter_columns_split_model_and_ngram_work():
    session = SessionStats()
    tally = {"rounds": 10, "drafted_tokens": 30, "accepted_tokens": 20, "ngram_rounds": 4,
             "ngram_drafted_tokens": 12, "ngram_accepted_tokens": 9}  # fmt: skip
    fields = RequestSample.speculative_fields(tally)
    assert fields == {"model_accepted": 11, "model_drafted": 18, "model_rounds": 6,
                      "ngram_accepted": 9, "ngram_drafted": 12, "ngram_rounds": 4}  # fmt: skip
    assert RequestSample.speculative_fields(None) == {}
    session.add_completed(RequestSample(0.1, 10, 0, 0.5, 5, 1.0, 1.0, **fields))
    session.add_completed(_sample(0.1, 10, 5, 1.0, 1.0))  # a request that never drafted
    total = session.all_time
    assert total.accepted_per_round == pytest.approx(11 / 6)  # n-gram rounds excluded
    plain = render_rows(session, None)
    assert plain[1].split() == ["TTFT", "cached", "prefill", "decode", "batch"]
    lines = render_rows(session, None, drafter="MTP", ngram=True)
    assert lines[1].split() == ["TTFT", "cached", "prefill", "decode", "batch", "MTP", "acc/rnd",
                                "ngram", "ng", "rnds"]  # fmt: skip
    assert all(len(line) == WIDTH + 19 + 18 for line in lines[1:])
    assert lines[2].split()[-4:] == ["11/18", "1.83", "9/12", "4"]
    mtp_only = render_rows(session, None, drafter="MTP")
    assert len(mtp_only[2]) == WIDTH + 19 and mtp_only[2].split()[-2:] == ["11/18", "1.83"]


def test_last_ten_row_once_more_than_ten_completed():
    session = SessionStats()
    for index in range(12):
        session.add_completed(_sample(0.1 * (index + 1), 10, 5, 1.0, 1.0))
    recent = session.last_ten()
    assert recent is not None and recent.requests == 10
    assert recent.mean_ttft_s == pytest.approx(sum(0.1 * i for i in range(3, 13)) / 10)
    lines = render_rows(session, None, "Press Ctrl+C again within 5 s to close")
    assert lines[0] == "12 done, 0 failed, 0 cancelled, 0 rejected"
    assert lines[3].startswith("last 10") and lines[4].startswith("Press Ctrl+C")


def test_panel_only_on_an_interactive_terminal_at_info_or_more(monkeypatch):
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm")
    assert panel_wanted("on", "info", Tty())
    assert not panel_wanted("off", "info", Tty())
    assert not panel_wanted("on", "warning", Tty())
    assert not panel_wanted("on", "info", open(os.devnull, "w"))  # redirected
    monkeypatch.setenv("TERM", "dumb")
    assert not panel_wanted("on", "info", Tty())


class Tmux:
    """ninfer-serve (fake engine) in a detached tmux pane of our own tmux server."""

    def __init__(self, *flags: str) -> None:
        self.socket = f"ninfer-panel-{os.getpid()}-{free_port()}"
        self.port = free_port()
        env = f"PYTHONPATH={HERE.parent / 'python'}:{HERE} TERM=xterm-256color"
        command = f"env {env} {sys.executable} {HERE / 'fake_serve.py'} --port {self.port} "
        self._tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "40",
                   command + " ".join(flags) + "; sleep 60")  # fmt: skip

    def _tmux(self, *args: str) -> str:
        result = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True)
        return result.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, text: str, seconds: float = 15.0) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} on the screen:\n{self.screen()}")

    def chat(self, count: int) -> None:
        body = {"model": "fake-chat", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(count):
            reply = httpx.post(f"http://127.0.0.1:{self.port}/v1/chat/completions", json=body)
            assert reply.status_code == 200

    def close(self) -> None:
        self._tmux("kill-server")


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


@needs_tmux
def test_panel_is_pinned_beneath_the_records_and_updates():
    tmux = Tmux("--log-stats-interval-ms", "200")
    try:
        tmux.wait_for("ready: serving")
        tmux.chat(2)
        screen = tmux.wait_for("2 done, 0 failed")
        lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
        title = next(i for i, line in enumerate(lines) if line.startswith("2 done"))
        assert lines[title + 1].split() == ["TTFT", "cached", "prefill", "decode", "batch"]
        assert lines[title + 2].startswith("all 2")
        assert any("req#2 done" in line for line in lines[:title])  # records scroll above it
        tmux.chat(9)
        screen = tmux.wait_for("11 done")
        assert "last 10" in screen and "all 11" in screen
        tmux.keys("C-c")  # the confirmation sits on the bottom line, beneath the panel
        screen = tmux.wait_for("Press Ctrl+C again within 5 s to close")
        lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
        assert lines[-1].startswith("Press Ctrl+C again") and lines[-2].startswith("last 10")
        tmux.keys("C-c")
        screen = tmux.wait_for("server stopped")
        assert "11 done" in screen  # left on screen as ordinary output
        assert "Press Ctrl+C again" not in screen
    finally:
        tmux.close()


@needs_tmux
def test_panel_off_leaves_only_records():
    tmux = Tmux("--log-stats-panel", "off")
    try:
        tmux.wait_for("ready: serving")
        tmux.chat(1)
        screen = tmux.wait_for("req#1 done")
        assert "done, 0 failed" not in screen and "TTFT  " not in screen
    finally:
        tmux.close()
