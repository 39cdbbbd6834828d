"""Rendering engine results as Chat Completions objects (aggregate and stream chunks)."""

from __future__ import annotations

import secrets
import time
from typing import Any

from ninfer.engine_types import Timings

# Engine finish reasons that a client can see; "cancelled" never reaches a live client.
_FINISH_REASONS = {"stop": "stop", "length": "length"}


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def finish_reason(engine_reason: str | None) -> str:
    return _FINISH_REASONS.get(engine_reason or "", "stop")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def llama_timings(
    timings: Timings | None, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> dict[str, float | int]:
    """llama.cpp's `timings` object; rates are finite zeros when undefined."""
    prompt_ms = timings.prompt_ms if timings else 0.0
    predicted_ms = timings.predicted_ms if timings else 0.0
    prompt_n = prompt_tokens - cached_tokens
    # The first output token closes the prompt phase, so decode has n - 1 intervals.
    intervals = max(completion_tokens - 1, 0)
    return {
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


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


class ChatRenderer:
    """Builds the response objects of one completion; all share its id, model and time."""

    def __init__(self, model: str) -> None:
        self.id = completion_id()
        self.model = model
        self.created = int(time.time())

    def aggregate(
        self, content: str, reason: str, usage_obj: dict[str, Any], timings: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": reason,
                }
            ],
            "usage": usage_obj,
            "timings": timings,
        }

    def chunk(self, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return self._chunk(
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        )

    def role_chunk(self) -> dict[str, Any]:
        return self.chunk({"role": "assistant", "content": ""})

    def content_chunk(self, text: str) -> dict[str, Any]:
        return self.chunk({"content": text})

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
