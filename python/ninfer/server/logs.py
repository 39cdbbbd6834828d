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


def configure_logging(level_name: str) -> None:
    logging.addLevelName(TRACE, "TRACE")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "ninfer", False):  # ours from an earlier call; leave others alone
            root.removeHandler(handler)
    if level_name == "off":
        root.setLevel(logging.CRITICAL + 1)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.ninfer = True  # type: ignore[attr-defined]
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d %(levelname)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
        )
    )
    root.addHandler(handler)
    root.setLevel(_LEVELS[level_name])
