"""The generation requests in flight, so that stopping the server can end them at once.

Granian's graceful stop waits for open responses, and a stream can run for minutes; on stop
every running or queued request is cancelled and answers 503 service_unavailable (or one
error event on a stream that already started), and new requests are refused.
"""

from __future__ import annotations

from typing import Any

from ninfer.server.errors import ApiError


class InflightRequests:
    def __init__(self, telemetry: Any = None) -> None:
        self._handles: set[Any] = set()
        self.closing = False
        # Every generation passes through this registry, so it also carries the server's
        # request telemetry (server/telemetry.py) to run_generation.
        self.telemetry = telemetry

    def add(self, handle: Any) -> None:
        if self.closing:
            handle.cancel()
            raise shutting_down()
        self._handles.add(handle)

    def discard(self, handle: Any) -> None:
        self._handles.discard(handle)

    def check_open(self) -> None:
        if self.closing:
            raise shutting_down()

    def shutdown(self) -> None:
        self.closing = True
        for handle in list(self._handles):
            handle.cancel()

    def __len__(self) -> int:
        return len(self._handles)


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", code="service_unavailable")
