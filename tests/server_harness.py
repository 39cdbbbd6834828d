"""Start the real ASGI app on Granian's embedded server in a background thread (loopback)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ninfer.protocols.served_model import load_served_model
from ninfer.server.app import AppConfig, NInferApp
from ninfer.server.embedded import make_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    engine: Any
    app: NInferApp
    port: int
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    server: Any

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """What SIGTERM does: end requests in flight, then stop serving."""

        def stop_in_loop() -> None:
            self.app.begin_shutdown()
            self.server.stop()

        self.loop.call_soon_threadsafe(stop_in_loop)
        self.thread.join(10)


def start_server(
    engine: Any,
    config: AppConfig | None = None,
    telemetry: Any = None,
    wrap: Callable[[Any], Any] | None = None,
    **served_kwargs: Any,
) -> RunningServer:
    """`wrap`, if given, wraps the ASGI app the HTTP server runs (e.g. a RecordingApp)."""
    served = load_served_model(engine, **served_kwargs)
    ready = threading.Event()
    app = NInferApp(served, config or AppConfig(), on_ready=ready.set, telemetry=telemetry)
    port = free_port()
    holder: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        holder["loop"] = loop
        holder["server"] = make_server(wrap(app) if wrap else app, "127.0.0.1", port)
        loop.run_until_complete(holder["server"].serve())
        # the loop is left open: Granian's runtime may still hold callbacks into it

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("server did not become ready")
    running = RunningServer(engine, app, port, thread, holder["loop"], holder["server"])
    _wait_listening(running.base_url)
    return running


def _wait_listening(base_url: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(base_url + "/health", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.02)
    raise RuntimeError("server is not accepting connections")
