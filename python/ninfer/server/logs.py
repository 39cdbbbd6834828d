"""stderr logging in `YYYY-MM-DD HH:MM:SS.mmm LEVEL message` form."""

from __future__ import annotations

import logging
import sys

TRACE = 5
_LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of each record (it may be replaced)."""

    ninfer = True

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001
        pass


def configure_logging(level_name: str) -> None:
    logging.addLevelName(TRACE, "TRACE")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "ninfer", False):  # ours from an earlier call; leave others alone
            root.removeHandler(handler)
    if level_name == "off":
        root.setLevel(logging.CRITICAL + 1)
        return
    handler = _StderrHandler()
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d %(levelname)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
        )
    )
    root.addHandler(handler)
    root.setLevel(_LEVELS[level_name])
