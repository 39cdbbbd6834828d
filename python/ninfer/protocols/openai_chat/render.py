"""Rendering engine results as Chat Completions objects (aggregate and stream chunks)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ninfer.engine_types import Timings
from ninfer.outputs.channels import ToolCall
from ninfer.protocols.conversation import CUSTOM_TOOL_INPUT, ToolDefinition
from ninfer.protocols.turn import TurnResult, TurnUsage


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def usage(account: TurnUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": account.prompt_tokens,
        "completion_tokens": account.completion_tokens,
        "total_tokens": account.total_tokens,
        "prompt_tokens_details": {"cached_tokens": account.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": account.reasoning_tokens},
    }


def tool_calls(calls: Sequence[ToolCall], tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Published calls; a free-form custom tool's call carries its one string as `input`."""
    custom = {t.name for t in tools if t.custom}
    rendered = []
    for call in calls:
        if call.name in custom:
            rendered.append(
                {
                    "id": call.id,
                    "type": "custom",
                    "custom": {"name": call.name, "input": _custom_input(call.arguments)},
                }
            )
        else:
            rendered.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            )
    return rendered


def _custom_input(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_TOOL_INPUT), str):
        return value[CUSTOM_TOOL_INPUT]
    return arguments


def llama_timings(
    timings: Timings | None, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> dict[str, float | int]:
    """llama.cpp's `timings` object; rates are finite zeros when undefined."""
    prompt_ms = timings.prompt_ms if timings else 0.0
    predicted_ms = timings.predicted_ms if timings else 0.0
    prompt_n = prompt_tokens - cached_tokens
    # The first output token closes the prompt phase, so decode has n - 1 intervals.
    intervals = max(completion_tokens - 1, 0)
    result: dict[str, float | int] = {
        "cache_n": cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": _ratio(prompt_ms, prompt_n),
        "prompt_per_second": _ratio(prompt_n * 1000.0, prompt_ms),
        "predicted_n": completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": _ratio(predicted_ms, intervals),
        "predicted_per_second": _ratio(intervals * 1000.0, predicted_ms),
    }
    if timings and timings.draft_n > 0:  # only requests that verified speculative proposals
        result["draft_n"] = timings.draft_n
        result["draft_n_accepted"] = timings.draft_n_accepted
    return result


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


class ChatRenderer:
    """Builds the response objects of one completion; all share its id, model and time."""

    def __init__(self, model: str) -> None:
        self.id = completion_id()
        self.model = model
        self.created = int(time.time())

    def aggregate(
        self,
        result: TurnResult,
        tools: Sequence[ToolDefinition],
        timings: dict[str, Any],
        prompt_token_ids: list[int] | None = None,
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": result.content if result.content or not result.tool_calls else None,
            "refusal": None,
        }
        if result.reasoning:
            message["reasoning_content"] = result.reasoning
        if result.tool_calls:
            message["tool_calls"] = tool_calls(result.tool_calls, tools)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [choice],
            "usage": usage(result.usage),
            "timings": timings,
        }
        if prompt_token_ids is not None:
            body["prompt_token_ids"] = prompt_token_ids
            choice["token_ids"] = result.token_ids
        return body

    def chunk(self, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return self._chunk(
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        )

    def role_chunk(self) -> dict[str, Any]:
        return self.chunk({"role": "assistant", "content": ""})

    def content_chunk(self, text: str) -> dict[str, Any]:
        return self.chunk({"content": text})

    def reasoning_chunk(self, text: str) -> dict[str, Any]:
        return self.chunk({"reasoning_content": text})

    def tool_calls_chunk(self, calls: list[dict[str, Any]]) -> dict[str, Any]:
        return self.chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})

    def progress_chunk(self, progress: dict[str, Any]) -> dict[str, Any]:
        chunk = self._chunk([])
        chunk["prompt_progress"] = progress
        return chunk

    def finish_chunk(self, reason: str) -> dict[str, Any]:
        return self.chunk({}, reason)

    def usage_chunk(
        self, usage_obj: dict[str, Any], *, with_choice: bool = False
    ) -> dict[str, Any]:
        """OpenAI sends usage with empty choices; some strict parsers need one empty choice."""
        choices = [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}]
        chunk = self._chunk(choices if with_choice else [])
        chunk["usage"] = usage_obj
        return chunk

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
