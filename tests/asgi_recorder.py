"""An ASGI wrapper that records every HTTP exchange: what a client sent, the status it got and
the body it was answered with.

Tests of real clients use it to check what reached the server (the tool results a client
sends back, the query strings and headers it adds) and what the server said (the tool calls
it emitted, streamed or not) without a proxy in between.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Exchange:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    status: int | None = None
    response: bytearray = field(default_factory=bytearray)

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The answer's JSON payloads: each SSE `data:` line of a stream (not `[DONE]`), or
        the one JSON body of an answer that was not streamed."""
        text = self.response.decode("utf-8", "replace")
        if not text.lstrip().startswith(("event:", "data:", ":")):
            return [json.loads(text)] if text.strip() else []
        payloads = []
        for line in text.splitlines():
            if line.startswith("data:") and (data := line[5:].strip()) and data != "[DONE]":
                payloads.append(json.loads(data))
        return payloads


class RecordingApp:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(
            scope["method"],
            scope["path"],
            scope.get("query_string", b"").decode("latin-1"),
            {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])},
        )
        self.exchanges.append(exchange)

        async def receive_recorded() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                exchange.body += message.get("body", b"")
            return message

        async def send_recorded(message: Any) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body":
                exchange.response += message.get("body", b"")
            await send(message)

        await self.app(scope, receive_recorded, send_recorded)

    def posts(self, path: str) -> list[Exchange]:
        """The POSTs to `path` (any query string), oldest first."""
        return [e for e in self.exchanges if e.method == "POST" and e.path == path]
