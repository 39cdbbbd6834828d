"""The start-up heap is frozen out of full collections; objects made later are not."""

from __future__ import annotations

import gc
import weakref

from ninfer.server.startup_heap import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


def test_startup_objects_are_frozen_and_later_garbage_is_still_collected():
    table = [[i] for i in range(50_000)]  # long-lived containers (the GC tracks these)
    try:
        frozen = freeze_startup_heap()
        assert frozen >= len(table)
        assert gc.get_freeze_count() == frozen
        later = _Node()  # made after start-up: collected as usual
        alive = weakref.ref(later)
        del later
        gc.collect()
        assert alive() is None
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
