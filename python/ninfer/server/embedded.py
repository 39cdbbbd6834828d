"""Running the ASGI app on Granian's embedded server, inside this process and event loop.

One process holds one engine, so the server must not fork workers: Granian's embedded
`Server` serves the app on the running asyncio loop. HTTP/1.1 is pinned because an HTTP/2
stream cancel does not reach the app (granian issue #917). The listening socket is ours
(see listener.py), handed to Granian by file descriptor.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from granian._granian import SocketHolder
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server.embed import Server

from ninfer.server.listener import BACKLOG, open_listener
from ninfer.server.stopping import StopSignals

# About the largest request line plus headers Granian reads before answering 431 (the bound
# is checked per read, so slightly more can pass); its default of 408 KiB is less than a long
# token or cookie jar can need. The read buffer grows only as a request needs it. The number
# of headers is capped separately, at 100, by Granian's HTTP parser, which Granian does not
# expose (docs/serving.md).
MAX_REQUEST_HEAD_BYTES = 4 << 20


class _OwnSocketServer(Server):
    """Granian's embedded server on a listening socket we created and configured."""

    def __init__(self, app: Any, listener: socket.socket, **options: Any) -> None:
        host, port = listener.getsockname()[:2]
        super().__init__(app, address=host, port=port, backlog=BACKLOG, **options)
        self.listener = listener

    def _init_shared_socket(self) -> None:
        # Instead of Granian binding its own listener from (address, port). Its worker
        # takes ownership of the descriptor and closes it when it stops, so it gets a
        # duplicate; ours is closed after serving.
        descriptor = self.listener.dup().detach()
        self._ssp = None
        self._shd = SocketHolder(descriptor, False, BACKLOG)
        self._sfd = descriptor

    def stop(self) -> None:
        # Granian stops accepting on its duplicate; closing ours too lets the kernel refuse
        # new connections now instead of queueing them until the worker has wound down.
        super().stop()
        self.listener.close()

    async def serve(self, spawn_target: Callable[..., None] | None = None) -> None:
        try:
            await super().serve(spawn_target)
        finally:
            self.listener.close()


def make_server(
    app: Any,
    host: str,
    port: int,
    *,
    debug: bool = False,
    listener: socket.socket | None = None,
) -> Server:
    return _OwnSocketServer(
        app,
        listener if listener is not None else open_listener(host, port),
        interface=Interfaces.ASGI,  # with lifespan: the app logs readiness once bound
        http=HTTPModes.http1,
        http1_settings=HTTP1Settings(max_buffer_size=MAX_REQUEST_HEAD_BYTES),
        websockets=False,
        log_enabled=debug,
        log_level=LogLevels.debug if debug else LogLevels.warning,
    )


async def serve(
    app: Any,
    host: str,
    port: int,
    *,
    on_stop: Callable[[], None],
    is_ready: Callable[[], bool],
    debug: bool = False,
    prompt: Callable[[str | None], None] | None = None,
    on_signals: Callable[[StopSignals], None] | None = None,
) -> StopSignals:
    """Serve until a signal stops it (stopping.py); `on_stop` runs first, so open streams end
    promptly. The signal handlers stay installed, so that one more Ctrl+C while the caller
    closes the engine exits at once; the caller removes them when it is done. `on_signals`
    receives them once installed (the caller can then stop the server itself, `fail`)."""
    server = make_server(app, host, port, debug=debug)

    def stop() -> None:
        on_stop()
        server.stop()

    signals = StopSignals(asyncio.get_running_loop(), stop, is_ready, prompt=prompt)
    signals.install()
    if on_signals is not None:
        on_signals(signals)
    try:
        await server.serve()
    except BaseException:
        signals.remove()
        raise
    return signals
