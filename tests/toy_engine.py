"""Helpers for engine tests over the native ToyModel (no weights, deterministic logits)."""

from __future__ import annotations

import select
import time
from dataclasses import dataclass, field
from typing import Any

from ninfer import _core

VOCAB = 256


def ascii_token_bytes(vocab: int = VOCAB) -> list[bytes]:
    """Printable ASCII tokens with a mix of lengths: 1-byte ids below 160, 2-3 byte above."""
    table = []
    for i in range(vocab):
        ch = chr(32 + i % 95)
        if i < 160:
            table.append(ch.encode())
        else:
            table.append((ch + chr(32 + (i * 7) % 95) * (1 + i % 2)).encode())
    return table


def make_engine(**options: Any) -> Any:
    vocab = options.pop("vocab", VOCAB)
    token_bytes = options.pop("token_bytes", None) or ascii_token_bytes(vocab)
    opts = {"max_concurrency": 1, "max_context": 512, "prefill_chunk": 16} | options
    return _core.Engine.toy(vocab, token_bytes, _core.EngineOptions(**opts))


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    text: bytes = b""
    events: list[Any] = field(default_factory=list)
    admitted: bool = False

    @property
    def final(self) -> Any:
        return self.events[-1]


def wait_events(engine: Any, timeout: float = 5.0) -> list[Any]:
    """Blocks on the engine's descriptor until events arrive (or the timeout passes)."""
    select.select([engine.event_fd], [], [], timeout)
    return engine.drain_events()


def collect(engine: Any, ids: list[int], timeout: float = 20.0) -> dict[int, Outcome]:
    """Gathers every event of `ids` until each has finished."""
    outcomes = {i: Outcome() for i in ids}
    open_ids = set(ids)
    deadline = time.monotonic() + timeout
    while open_ids:
        assert time.monotonic() < deadline, f"requests {sorted(open_ids)} did not finish"
        for ev in wait_events(engine, 0.5):
            out = outcomes.get(ev.request_id)
            if out is None:
                continue
            if ev.kind == "admitted":
                out.admitted = True
                continue
            out.events.append(ev)
            out.tokens += ev.token_ids
            out.text += ev.text
            if ev.finished:
                open_ids.discard(ev.request_id)
    return outcomes


def submit_ok(engine: Any, prompt: list[int], max_tokens: int, **kw: Any) -> int:
    result = engine.submit(prompt, max_tokens, **kw)
    assert result.accepted, result
    return result.request_id


def run_one(engine: Any, prompt: list[int], max_tokens: int, **kw: Any) -> Outcome:
    rid = submit_ok(engine, prompt, max_tokens, **kw)
    return collect(engine, [rid])[rid]


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)
