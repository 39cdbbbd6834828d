"""A tqdm byte-progress bar that can be switched off (tests, library use)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class _Silent:
    def update(self, n: int) -> None:
        pass


@contextlib.contextmanager
def progress_bar(total: int, description: str, *, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield _Silent()
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=description, unit="B", unit_scale=True, unit_divisor=1024) as bar:
        yield bar
