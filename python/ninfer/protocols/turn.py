"""One generated turn, decoded: engine events -> channel deltas, then the turn's result.

Every protocol adapter drives a `TurnDecoder` with the engine's events, in stream and
aggregate mode alike, and frames what it returns. It owns the one output decoder
(outputs/channels.py) and the one usage account:

* prompt tokens: the rendered prompt's ids (template included), as the engine reports them;
* completion tokens: the engine's accepted output tokens, a withheld stop token included;
* reasoning tokens: counted by the decoder on the tokens fed while reasoning was open,
  never by re-tokenizing text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ninfer.engine_types import EngineEvent, Timings
from ninfer.outputs import IncrementalTextDecoder
from ninfer.outputs.channels import (
    ChannelDelta,
    DecoderConfig,
    OutputDecoder,
    ToolCall,
    ToolCallParseReport,
    TurnEnd,
)

_FINISH_REASONS = {"stop": "stop", "length": "length"}


@dataclass(slots=True)
class TurnUsage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class TurnResult:
    reasoning: str
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    usage: TurnUsage
    timings: Timings | None
    token_ids: list[int]  # every accepted output token, a stop token included
    report: ToolCallParseReport | None
    event: EngineEvent


@dataclass(slots=True)
class TurnClock:
    """Server-side observation of a turn's progress, for per-token timing snapshots."""

    admitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    committed: int = 0

    def observe(self, token_count: int) -> None:
        if token_count <= 0:
            return
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.committed += token_count

    def snapshot(self) -> Timings:
        first = self.first_token or time.perf_counter()
        last = self.last_token or first
        return Timings(
            prompt_ms=(first - self.admitted) * 1000.0, predicted_ms=(last - first) * 1000.0
        )


class TurnDecoder:
    def __init__(self, config: DecoderConfig, prompt_tokens: int) -> None:
        self._decoder = OutputDecoder(config)
        self._text = IncrementalTextDecoder()
        self._prompt_tokens = prompt_tokens
        self.token_ids: list[int] = []
        self.clock = TurnClock()
        self.cached_tokens = 0  # the prefix cache's reuse, once the request is admitted

    @property
    def reasoning_complete(self) -> bool:
        return self._decoder.reasoning_complete

    def feed(self, event: EngineEvent) -> ChannelDelta:
        """The visible channel text this event adds (the final event's text included)."""
        self.token_ids += event.token_ids
        self.clock.observe(len(event.token_ids))
        text = self._text.feed(event.text)
        if event.finished:
            text += self._text.flush()
        return self._decoder.feed(text, event.token_ids)

    def finish(self, event: EngineEvent) -> tuple[ChannelDelta, TurnResult]:
        """The terminal delta (held text) and the turn's result, after `feed(event)`."""
        tail = self._decoder.finish(TurnEnd.from_engine(event.finish_reason, event.stop_reason))
        reason = _FINISH_REASONS.get(event.finish_reason or "", "stop")
        if tail.tool_calls and reason == "stop":
            reason = "tool_calls"
        completion = event.completion_tokens or len(self.token_ids)
        usage = TurnUsage(
            prompt_tokens=event.prompt_tokens or self._prompt_tokens,
            completion_tokens=completion,
            reasoning_tokens=min(tail.reasoning_tokens, completion),
            cached_tokens=event.cached_tokens or self.cached_tokens,
        )
        result = TurnResult(
            reasoning=self._decoder.reasoning,
            content=self._decoder.content,
            tool_calls=tail.tool_calls,
            finish_reason=reason,
            usage=usage,
            timings=event.timings,
            token_ids=list(self.token_ids),
            report=tail.report,
            event=event,
        )
        return tail.delta, result
