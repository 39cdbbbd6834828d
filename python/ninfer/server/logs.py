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
        root.removeHandler(handler)
    if level_name == "off":
        root.addHandler(logging.NullHandler())
        root.setLevel(logging.CRITICAL + 1)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d %(levelname)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
        )
    )
    root.addHandler(handler)
    root.setLevel(_LEVELS[level_name])
