"""The session statistics panel pinned beneath the scrolling records on an interactive terminal.

rich's live display does the terminal work: while it runs, writes to sys.stderr (every log
record) are printed above the panel, which is redrawn after each one, and the panel is left
on screen as ordinary output when it stops. The panel only reads the telemetry's session
aggregates; it changes nothing about requests. Redirected stderr never gets it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ninfer.server import console_units as units
from ninfer.server.session_stats import Aggregate, SessionStats

WIDTH = 66
_COLUMNS = (("", 9), ("TTFT", 9), ("cached", 16), ("prefill", 13), ("decode", 13), ("batch", 6))
# With speculative decoding: the model drafter's accepted / drafted tokens and accepted tokens
# per model-drafted round, then the n-gram part and its rounds (--ngram-draft-tokens only).
_DRAFTER_WIDTHS = (11, 8)
_NGRAM_COLUMNS = (("ngram", 10), ("ng rnds", 8))
REFRESH_S = 0.5  # the title's running/waiting gauges change without any record


def panel_wanted(flag: str, level: str, stream: TextIO | None = None) -> bool:
    """On only for an interactive terminal that takes cursor control, at info or more."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    interactive = bool(isatty and isatty()) and os.environ.get("TERM", "") not in ("", "dumb")
    return flag == "on" and interactive and level in ("trace", "debug", "info")


def render_rows(
    session: SessionStats,
    gauges: tuple[int, int] | None,
    prompt: str | None = None,
    *,
    drafter: str | None = None,
    ngram: bool = False,
) -> list[str]:
    """The panel as plain lines: the title (request outcomes, and the current gauges while
    throughput reporting is on), the header and rows (WIDTH columns, more with drafter
    columns), the bottom prompt. `drafter`: the model drafter's name (MTP) when one is on;
    `ngram`: n-gram drafting is on."""
    columns = list(_COLUMNS)
    if drafter:
        columns += [(drafter, _DRAFTER_WIDTHS[0]), ("acc/rnd", _DRAFTER_WIDTHS[1])]
    if ngram:
        columns += list(_NGRAM_COLUMNS)
    title = (
        f"{session.completed} done, {session.failed} failed, "
        f"{session.cancelled} cancelled, {session.rejected} rejected"
    )
    if gauges is not None:
        title += f" | {gauges[0]} running, {gauges[1]} waiting"
    lines = [title, _row(columns, [name for name, _ in columns])]
    lines.append(
        _row(columns, _cells(f"all {session.completed}", session.all_time, drafter, ngram))
    )
    recent = session.last_ten()
    if recent is not None:
        lines.append(_row(columns, _cells("last 10", recent, drafter, ngram)))
    if prompt:
        lines.append(prompt[: sum(width for _, width in columns)])
    return lines


def _cells(label: str, total: Aggregate, drafter: str | None, ngram: bool) -> list[str]:
    cells = [
        label,
        units.duration(total.mean_ttft_s),
        f"{units.count(total.cached_tokens)}/{units.count(total.prompt_tokens)}",
        units.rate(total.prefill_rate),
        units.rate(total.decode_rate),
        "-" if total.mean_batch is None else f"{total.mean_batch:.2f}",
    ]
    if drafter:
        per_round = total.accepted_per_round
        cells += [
            f"{units.count(total.model_accepted)}/{units.count(total.model_drafted)}",
            "-" if per_round is None else f"{per_round:.2f}",
        ]
    if ngram:
        cells += [
            f"{units.count(total.ngram_accepted)}/{units.count(total.ngram_drafted)}",
            units.count(total.ngram_rounds),
        ]
    return cells


def _row(columns: list[tuple[str, int]], cells: list[str]) -> str:
    out = ""
    for (name, width), cell in zip(columns, cells, strict=True):
        out += cell[:width].ljust(width) if name == "" else cell[: width - 1].rjust(width)
    return out


class _CursorKeepingConsole(Console):
    """Never hides the cursor: the process may leave at once (a third Ctrl+C, os._exit)
    without the live display's cleanup, and must not leave the terminal without one."""

    def show_cursor(self, show: bool = True) -> bool:
        return False


class StatsPanel:
    def __init__(
        self,
        session: SessionStats,
        engine: Any,
        *,
        colours: bool,
        show_gauges: bool,
        stream: TextIO | None = None,
        drafter: str | None = None,
        ngram: bool = False,
    ) -> None:
        self._session = session
        self._engine = engine
        self._colours = colours
        self._show_gauges = show_gauges
        self._drafter = drafter
        self._ngram = ngram
        self._prompt: str | None = None
        self._console = _CursorKeepingConsole(
            file=stream if stream is not None else sys.stderr,  # the real stream, not the proxy
            force_terminal=True,
            color_system="standard" if colours else None,
            highlight=False,
            soft_wrap=True,
        )
        self._live = Live(
            self._renderable(),
            console=self._console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=True,
            transient=False,
        )
        self._task: asyncio.Task[None] | None = None
        self._started = False

    def start(self) -> None:
        self._started = True
        self._live.start(refresh=True)
        try:
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop())
        except RuntimeError:
            self._task = None  # no loop: redrawn only on records and changes

    def stop(self) -> None:
        if not self._started:
            return  # stopped before the server was ready: nothing was drawn
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._prompt = None
        self.refresh()
        self._started = False
        self._live.stop()

    def set_prompt(self, text: str | None) -> None:
        """The bottom line beneath the panel (the Ctrl+C confirmation)."""
        self._prompt = text
        self.refresh()

    def refresh(self) -> None:
        if self._started:
            self._live.update(self._renderable(), refresh=True)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            self.refresh()

    def _renderable(self) -> Group:
        gauges = None
        if self._show_gauges:
            stats = self._engine.stats()
            gauges = (int(stats.get("running", 0)), int(stats.get("pending", 0)))
        lines = render_rows(
            self._session, gauges, self._prompt, drafter=self._drafter, ngram=self._ngram
        )
        style = "cyan" if self._colours else ""
        texts = [
            Text(line, style=style if 0 < i < len(lines) else "") for i, line in enumerate(lines)
        ]
        if self._prompt:
            texts[-1].stylize("bold" if self._colours else "")
        return Group(*texts)
