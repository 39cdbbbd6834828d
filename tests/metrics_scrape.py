"""Scraping GET /metrics in tests: parsed with prometheus_client's own parser."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Scrape:
    def __init__(self, text: str) -> None:
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self.samples: Samples = {}
        for family in self.families.values():
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                self.samples[key] = sample.value

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, tuple(sorted(labels.items())))]

    def outcome(self, outcome: str) -> float:
        return self.value("ninfer_requests_total", outcome=outcome)


def scrape(base_url: str, api_key: str | None = None) -> Scrape:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    reply = httpx.get(base_url + "/metrics", headers=headers, timeout=5)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(reply.text)


def scrape_settled(base_url: str, before: Scrape, settled: int, api_key: str | None = None):
    """A scrape once `settled` more requests were timed: the histograms are observed when a
    request's answer has been sent, which may trail the client's receipt of it a little."""
    name = "ninfer_request_duration_seconds_count"
    wait_for(lambda: scrape(base_url, api_key).value(name) >= before.value(name) + settled)
    return scrape(base_url, api_key)


def wait_for(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def leave_stream_midway(port: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    """POSTs a streaming request, reads a few events, then closes the socket (a client that
    went away: the server must cancel the generation)."""
    data = json.dumps(body).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        received = b""
        while received.count(b"data: ") < 4:
            chunk = sock.recv(4096)
            assert chunk, "the server closed the stream early"
            received += chunk
