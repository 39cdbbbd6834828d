"""Watching for a client disconnect while a request runs.

Granian does not raise when sending to a closed peer; the disconnect arrives only as an
`http.disconnect` message from `receive()`. Every generation request therefore runs with a
task that awaits `receive()` and cancels the engine request when the peer leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ninfer.server.http import ClientDisconnected, Receive

T = TypeVar("T")


class DisconnectWatcher:
    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._callbacks: list[Callable[[], None]] = []
        self.disconnected = asyncio.Event()
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        self.disconnected.set()
        for callback in self._callbacks:
            callback()

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        if self.disconnected.is_set():
            callback()
        else:
            self._callbacks.append(callback)

    async def race(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable`, or raise ClientDisconnected if the peer leaves first."""
        work = asyncio.ensure_future(awaitable)
        gone = asyncio.ensure_future(self.disconnected.wait())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if work.done():
            return work.result()
        work.cancel()
        raise ClientDisconnected()

    def stop(self) -> None:
        self._task.cancel()
