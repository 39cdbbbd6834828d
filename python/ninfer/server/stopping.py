"""Stopping the server from signals: Ctrl+C twice, SIGTERM (and a closed terminal) at once.

A single stray Ctrl+C must not end a server that other people's requests depend on, so the
first press only asks for confirmation; a second press within the window stops. Before the
server is ready nothing is at stake yet, and one press ends startup. While a stop is under
way, one more press exits at once instead of waiting for it to finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger("ninfer.server")

CONFIRM_WINDOW_S = 5.0
EXIT_AT_ONCE_STATUS = 130  # the shell's convention for "ended by SIGINT"


def confirm_prompt(window_s: float) -> str:
    return f"Press Ctrl+C again within {window_s:g} s to close"


class StopSignals:
    """Owns SIGINT/SIGTERM/SIGHUP on `loop` while the server runs; `stop` ends serving."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stop: Callable[[], None],
        is_ready: Callable[[], bool],
        *,
        window_s: float = CONFIRM_WINDOW_S,
        console: TextIO | None = None,
        exit_now: Callable[[int], None] = os._exit,
        prompt: Callable[[str | None], None] | None = None,
    ) -> None:
        self._loop = loop
        self._stop = stop
        self._is_ready = is_ready
        self._window_s = window_s
        self._console = console if console is not None else sys.stderr
        self._exit_now = exit_now
        self._prompt = prompt  # shows/clears the bottom line itself (the statistics panel)
        self._confirm_deadline: asyncio.TimerHandle | None = None
        self._installed: list[int] = []
        self._prompt_shown = False
        self.stopping = False
        self.stopped_before_ready = False

    def install(self) -> None:
        self._add(signal.SIGINT, self.interrupt)
        self._add(signal.SIGTERM, self.terminate)
        hangup = getattr(signal, "SIGHUP", None)
        # A server started under nohup ignores SIGHUP on purpose; keep it that way.
        if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
            self._add(hangup, self.terminate)

    def remove(self) -> None:
        for sig in self._installed:
            self._loop.remove_signal_handler(sig)
        self._installed.clear()
        self._hide_prompt()

    def _add(self, sig: int, handler: Callable[[], None]) -> None:
        self._loop.add_signal_handler(sig, handler)
        self._installed.append(sig)

    def interrupt(self) -> None:
        """Ctrl+C (SIGINT)."""
        if self.stopping:
            log.warning("interrupted again while stopping: exiting at once")
            for handler in logging.getLogger().handlers:
                handler.flush()  # os._exit skips the interpreter's own flushing
            self._exit_now(EXIT_AT_ONCE_STATUS)
            return
        if not self._is_ready():
            self.stopped_before_ready = True
            self._begin_stop("interrupted before the server was ready")
        elif self._confirm_deadline is not None:
            self._begin_stop("stopping (Ctrl+C)")
        else:
            self._confirm_deadline = self._loop.call_later(self._window_s, self._keep_serving)
            self._show_prompt()

    def terminate(self) -> None:
        """SIGTERM, or SIGHUP from a closed terminal: no confirmation."""
        if not self.stopping:
            self._begin_stop("stopping (termination signal)")

    def fail(self, reason: str) -> None:
        """An unrecoverable failure (a fatal device error): stop at once, as SIGTERM does."""
        if not self.stopping:
            self._begin_stop(reason, level=logging.ERROR)

    def _keep_serving(self) -> None:
        self._confirm_deadline = None
        self._hide_prompt()

    def _begin_stop(self, reason: str, level: int = logging.INFO) -> None:
        if self._confirm_deadline is not None:
            self._confirm_deadline.cancel()
            self._confirm_deadline = None
        self._hide_prompt()
        self.stopping = True
        log.log(level, "%s", reason)
        self._stop()

    def _interactive(self) -> bool:
        isatty = getattr(self._console, "isatty", None)
        return bool(isatty and isatty())

    def _show_prompt(self) -> None:
        if self._prompt is not None:
            self._prompt(confirm_prompt(self._window_s))
            self._prompt_shown = True
        elif self._interactive():
            # The console's bottom line: overwrite the echoed ^C, no newline, erased later.
            self._console.write("\r\x1b[K" + confirm_prompt(self._window_s))
            self._console.flush()
            self._prompt_shown = True
        else:
            log.warning("%s", confirm_prompt(self._window_s))

    def _hide_prompt(self) -> None:
        if self._prompt_shown:
            self._prompt_shown = False
            if self._prompt is not None:
                self._prompt(None)
                return
            self._console.write("\r\x1b[K")
            self._console.flush()
