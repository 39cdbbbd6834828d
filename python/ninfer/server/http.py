"""A thin request/response layer over raw ASGI (no framework: the app has four routes)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from ninfer.server.errors import ApiError
from ninfer.server.json_text import check_json_text

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

_json_encoder = msgspec.json.Encoder()


def encode_json(obj: Any) -> bytes:
    return _json_encoder.encode(obj)


class ClientDisconnected(Exception):
    """The peer went away; there is nobody left to answer."""


class HttpRequest:
    def __init__(
        self, scope: dict[str, Any], receive: Receive, send: Send, request_id: str
    ) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.request_id = request_id
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        self.response_started = False
        self.status: int | None = None
        self.received = time.perf_counter()  # arrival, for preparation and TTFT timings

    async def read_body(self, limit_bytes: int) -> bytes:
        """The whole body, refused with 413 once it exceeds the limit (before any parsing) and
        with 400 `invalid_json` when it is not UTF-8 JSON text (every body here is JSON)."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
            raise _too_large(limit_bytes)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit_bytes:
                raise _too_large(limit_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                body = b"".join(chunks)
                check_json_text(body)
                return body

    async def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.response_started = True
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def send_body(self, data: bytes, *, more: bool = False) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def send_json(self, status: int, obj: Any) -> None:
        data = encode_json(obj)
        await self.start_response(
            status,
            [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        )
        await self.send_body(data)

    async def send_empty(self, status: int) -> None:
        await self.start_response(status, [(b"content-length", b"0")])
        await self.send_body(b"")


def _too_large(limit_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"request body exceeds this server's limit of {limit_bytes // (1 << 20)} MiB "
        "(--max-request-mib)",
        code="request_too_large",
    )
