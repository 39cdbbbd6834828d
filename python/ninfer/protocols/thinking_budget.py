"""Thinking budgets: the token-exact cap every protocol hands to the engine.

A request that starts in thinking mode may carry a cap (Anthropic `thinking.budget_tokens`,
otherwise `--default-thinking-budget`). The engine counts committed thinking tokens; at the
cap it commits the close sequence without sampling: Qwen's early-close guidance (or
`--thinking-budget-message`), the `</think>` control token and the line break after it, so the
output decoder closes the reasoning channel there and the answer follows. Those tokens count
as output like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.engine_types import ThinkingBudget
from ninfer.outputs.channels import ThinkingStart
from ninfer.server.errors import ApiError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Qwen's published early-close text for budgeted thinking (the guidance, then the marker).
QWEN_GUIDANCE = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the "
    "thinking directly now.\n"
)
_AFTER_CLOSE = "\n\n"


@dataclass(frozen=True, slots=True)
class ThinkingClose:
    """The tokens committed when a cap is reached, and the markers the engine watches."""

    ids: tuple[int, ...]
    open_id: int | None
    close_id: int

    @classmethod
    def build(cls, tokenizer: Any, message: str | None) -> ThinkingClose | None:
        """None when the tokenizer has no `</think>` control token (no thinking markup)."""
        token_to_id = getattr(tokenizer, "token_to_id", None)
        close_id = token_to_id(THINK_CLOSE) if callable(token_to_id) else None
        if not isinstance(close_id, int):
            return None
        open_id = token_to_id(THINK_OPEN)
        head, tail = _split_message(QWEN_GUIDANCE + THINK_CLOSE if message is None else message)
        ids = [*_plain(tokenizer, head), close_id, *_plain(tokenizer, tail or _AFTER_CLOSE)]
        return cls(tuple(ids), open_id if isinstance(open_id, int) else None, close_id)


def _split_message(message: str) -> tuple[str, str]:
    """Guidance before the last close marker and what follows it; the marker is appended
    when the message lacks it."""
    head, marker, tail = message.rpartition(THINK_CLOSE)
    if not marker:
        return message, ""
    return head, tail


def _plain(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, allow_special=False)) if text else []


def plan_thinking_budget(
    close: ThinkingClose | None,
    thinking: ThinkingStart,
    limit: int | None,
    max_tokens: int,
    param: str,
) -> ThinkingBudget | None:
    """The engine cap for a request whose output starts as `thinking`, or None.

    A cap at or past the output budget never acts (the output limit ends thinking first). A
    cap before it needs room for the whole close sequence plus one answer token."""
    if limit is None or close is None or thinking is ThinkingStart.CLOSED:
        return None
    if limit >= max_tokens:
        return None
    needed = limit + len(close.ids) + 1
    if max_tokens < needed:
        raise ApiError(
            400,
            f"a thinking budget of {limit} tokens leaves no room in max_tokens {max_tokens} for "
            f"the {len(close.ids)}-token thinking close plus one answer token (needs at least "
            f"{needed})",
            code="thinking_budget_capacity_insufficient",
            param=param,
        )
    return ThinkingBudget(
        limit=limit,
        close_ids=list(close.ids),
        starts_open=thinking is ThinkingStart.OPEN,
        open_id=close.open_id,
        close_id=close.close_id,
    )
