"""Rendering a generated turn as a Messages response: the aggregate object and the SSE block
lifecycle (message_start, content_block_start/delta/stop per block, message_delta,
message_stop).

Blocks come in channel order: thinking (when the turn reasoned), text, then tool_use blocks,
which are published complete at the end of the turn (their input as one input_json_delta).
A thinking block closes with its signature (signature_delta in a stream); with
`display: "omitted"` its text stays empty and no thinking_delta is sent.
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

from ninfer.outputs.channels import ChannelDelta, ToolCall
from ninfer.protocols.anthropic_messages import signature
from ninfer.protocols.anthropic_messages.lowering import LoweredMessages
from ninfer.protocols.constraints import turn_observation
from ninfer.protocols.turn import TurnResult, TurnUsage

Event = tuple[str, dict[str, Any]]
_ID_ALPHABET = string.ascii_letters + string.digits


def _random_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def tool_use_id() -> str:
    return _random_id("toolu_01")


def usage(account: TurnUsage, *, output_tokens: int | None = None) -> dict[str, Any]:
    """Anthropic usage: input_tokens is the uncached part, cache reads are separate."""
    body: dict[str, Any] = {
        "input_tokens": account.prompt_tokens - account.cached_tokens,
        "output_tokens": account.completion_tokens if output_tokens is None else output_tokens,
        "cache_creation_input_tokens": None,  # unknown: the engine does not report writes
        "cache_read_input_tokens": account.cached_tokens,
    }
    if output_tokens is None:
        body["output_tokens_details"] = {"thinking_tokens": account.reasoning_tokens}
    return body


def published_calls(result: TurnResult, lowered: LoweredMessages) -> list[ToolCall]:
    calls = result.tool_calls
    return calls[:1] if lowered.single_call else calls


def stop_reason(result: TurnResult, lowered: LoweredMessages) -> tuple[str, str | None]:
    event = result.event
    if result.finish_reason == "tool_calls":
        return "tool_use", None
    if event.finish_reason == "stop" and isinstance(event.stop_reason, str):
        return "stop_sequence", event.stop_reason
    if event.finish_reason == "length":
        capped = lowered.asked_tokens > lowered.room
        if capped and result.usage.completion_tokens >= lowered.room:
            return "model_context_window_exceeded", None
        return "max_tokens", None
    return "end_turn", None


def _input(call: ToolCall) -> dict[str, Any]:
    value = json.loads(call.arguments)  # member order as the model wrote it
    return value if isinstance(value, dict) else {}


class MessageRenderer:
    """The objects of one response; they share its id and the client's model label."""

    def __init__(self, lowered: LoweredMessages) -> None:
        self.lowered = lowered
        self.id = _random_id("msg_01")

    def _envelope(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.lowered.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
        }

    def aggregate(self, result: TurnResult) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if result.reasoning:
            content.append(self._thinking_block(result.reasoning, signed=True))
        if result.content:
            content.append({"type": "text", "text": result.content})
        for call in published_calls(result, self.lowered):
            content.append(
                {"type": "tool_use", "id": tool_use_id(), "name": call.name, "input": _input(call)}
            )
        body = self._envelope(content)
        body["stop_reason"], body["stop_sequence"] = stop_reason(result, self.lowered)
        body["usage"] = usage(result.usage)
        self._observe(body, result)
        return body

    def _observe(self, body: dict[str, Any], result: TurnResult) -> None:
        """A constrained turn's observation: the aggregate body or the message_delta event."""
        observed = turn_observation(self.lowered.constraint, result)
        if observed is not None:
            body["constraint"] = observed

    def _thinking_block(self, reasoning: str, *, signed: bool) -> dict[str, Any]:
        visible = "" if self.lowered.thinking.omitted else reasoning
        return {
            "type": "thinking",
            "thinking": visible,
            "signature": signature.sign(reasoning) if signed else "",
        }

    # --- streaming -----------------------------------------------------------------------

    def message_start(self, account: TurnUsage) -> Event:
        message = self._envelope([])
        message["usage"] = usage(account, output_tokens=0)
        return "message_start", {"type": "message_start", "message": message}

    def message_end(self, result: TurnResult) -> list[Event]:
        reason, sequence = stop_reason(result, self.lowered)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(result.usage),
        }
        self._observe(delta, result)
        return [("message_delta", delta), ("message_stop", {"type": "message_stop"})]


class BlockStream:
    """Channel deltas -> content-block events, with the block indices they need."""

    def __init__(self, renderer: MessageRenderer) -> None:
        self._renderer = renderer
        self._omitted = renderer.lowered.thinking.omitted
        self._index = -1
        self._open: str | None = None  # "thinking" | "text"
        self._reasoning: list[str] = []

    def feed(self, delta: ChannelDelta, reasoning_complete: bool) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            if self._open != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": ""})
                self._open = "thinking"
            self._reasoning.append(delta.reasoning)
            if not self._omitted:
                events.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        if self._open == "thinking" and (reasoning_complete or delta.content):
            events += self._close()
        if delta.content:
            if self._open != "text":
                events += self._start({"type": "text", "text": ""})
                self._open = "text"
            events.append(self._delta({"type": "text_delta", "text": delta.content}))
        return events

    def finish(self, tail: ChannelDelta, result: TurnResult) -> list[Event]:
        events = self.feed(tail, reasoning_complete=True)
        events += self._close()
        for call in published_calls(result, self._renderer.lowered):
            events += self._start(
                {"type": "tool_use", "id": tool_use_id(), "name": call.name, "input": {}}
            )
            partial = json.dumps(_input(call), ensure_ascii=False, separators=(",", ":"))
            events.append(self._delta({"type": "input_json_delta", "partial_json": partial}))
            events += self._stop()
        return events

    def _start(self, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self._index += 1
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return [*events, ("content_block_start", start)]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {
            "type": "content_block_delta",
            "index": self._index,
            "delta": delta,
        }

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        events: list[Event] = []
        if self._open == "thinking":
            sig = signature.sign("".join(self._reasoning))
            events.append(self._delta({"type": "signature_delta", "signature": sig}))
        self._open = None
        return [*events, *self._stop()]

    def _stop(self) -> list[Event]:
        return [("content_block_stop", {"type": "content_block_stop", "index": self._index})]
