"""Running the ASGI app on Granian's embedded server, inside this process and event loop.

One process holds one engine, so the server must not fork workers: Granian's embedded
`Server` serves the app on the running asyncio loop. HTTP/1.1 is pinned because an HTTP/2
stream cancel does not reach the app (granian issue #917).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.server.embed import Server


def make_server(app: Any, host: str, port: int, *, debug: bool = False) -> Server:
    return Server(
        app,
        address=host,
        port=port,
        interface=Interfaces.ASGI,  # with lifespan: the app logs readiness once bound
        http=HTTPModes.http1,
        websockets=False,
        log_enabled=debug,
        log_level=LogLevels.debug if debug else LogLevels.warning,
    )


async def serve(
    app: Any, host: str, port: int, *, on_stop: Callable[[], None], debug: bool = False
) -> None:
    """Serve until SIGINT/SIGTERM; `on_stop` runs first, so open streams end promptly."""
    server = make_server(app, host, port, debug=debug)
    loop = asyncio.get_running_loop()

    def stop() -> None:
        on_stop()
        server.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        await server.serve()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    logging.getLogger("ninfer.server").info("server stopped")
