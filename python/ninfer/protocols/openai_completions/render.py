"""Legacy Completions response objects (aggregate and stream chunks)."""

from __future__ import annotations

import secrets
import time
from typing import Any


class CompletionRenderer:
    def __init__(self, model: str) -> None:
        self.id = f"cmpl-{secrets.token_hex(12)}"
        self.model = model
        self.created = int(time.time())

    def _body(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    @staticmethod
    def choice(text: str, reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    def aggregate(
        self, text: str, reason: str, usage: dict[str, Any], timings: dict[str, Any]
    ) -> dict[str, Any]:
        body = self._body([self.choice(text, reason)])
        body["usage"] = usage
        body["timings"] = timings
        return body

    def chunk(self, text: str, reason: str | None = None) -> dict[str, Any]:
        return self._body([self.choice(text, reason)])

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._body([])
        body["usage"] = usage
        return body


def completion_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
