"""Conversion progress: a redrawn bar on a terminal, plain lines in logs and captures."""

from __future__ import annotations

import io
import sys

from ninfer.convert.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_without_carriage_returns_when_stderr_is_not_a_terminal(monkeypatch):
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    with progress_bar(300 << 20, "converting model.gguf", enabled=True) as bar:
        for _ in range(300):
            bar.update(1 << 20)
    text = captured.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 10  # one per tenth, not one per update
    assert lines[0] == "converting model.gguf: 10% (30.0 MiB of 300.0 MiB)"
    assert lines[-1] == "converting model.gguf: 100% (300.0 MiB of 300.0 MiB)"


def test_plain_lines_end_with_a_final_line_even_when_updates_fall_short(monkeypatch):
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    with progress_bar(1000, "random weights", enabled=True) as bar:
        bar.update(50)
    assert captured.getvalue().splitlines() == ["random weights: 5% (50 B of 1000 B)"]
    with progress_bar(0, "empty", enabled=True):
        pass
    assert captured.getvalue().splitlines()[-1] == "empty: 100% (0 B of 0 B)"


def test_a_terminal_gets_the_redrawn_bar(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_bar(1 << 20, "converting", enabled=True) as bar:
        bar.update(1 << 20)
    assert "\r" in terminal.getvalue() and "converting" in terminal.getvalue()


def test_disabled_progress_writes_nothing(monkeypatch):
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    with progress_bar(10, "quiet", enabled=False) as bar:
        bar.update(10)
    assert captured.getvalue() == ""
