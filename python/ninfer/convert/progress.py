"""Byte progress of a conversion: a tqdm bar on a terminal, plain lines otherwise.

A bar redraws itself with carriage returns, which in a log file or a CI capture turns into
one unreadable line. When stderr is not a terminal the progress is written as ordinary
lines instead, one per tenth of the work (and a last one when it is done).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_STEPS = 10  # lines written for a whole conversion when stderr is not a terminal


class _Silent:
    def update(self, n: int) -> None:
        pass


class _PlainLines:
    """Progress as `description: 40% (1.2 GiB of 3.0 GiB)` lines, no carriage returns."""

    def __init__(self, total: int, description: str, stream: TextIO) -> None:
        self.total = max(total, 0)
        self.description = description
        self.stream = stream
        self.done = 0
        self._reported_step = 0

    def update(self, n: int) -> None:
        self.done += n
        step = _STEPS if self.total == 0 else min(self.done * _STEPS // self.total, _STEPS)
        if step > self._reported_step:
            self._reported_step = step
            self._write()

    def close(self) -> None:
        if self._reported_step < _STEPS:
            self._reported_step = _STEPS
            self._write()

    def _write(self) -> None:
        percent = 100 if self.total == 0 else min(100, self.done * 100 // self.total)
        self.stream.write(
            f"{self.description}: {percent}% ({_size(self.done)} of {_size(self.total)})\n"
        )
        self.stream.flush()


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{value:.1f} GiB"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


@contextlib.contextmanager
def progress_bar(total: int, description: str, *, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield _Silent()
        return
    stream = sys.stderr
    if not _is_terminal(stream):
        plain = _PlainLines(total, description, stream)
        yield plain
        plain.close()
        return
    from tqdm import tqdm

    with tqdm(
        total=total,
        desc=description,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=stream,
    ) as bar:
        yield bar
