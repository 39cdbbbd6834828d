"""Prefix-cache write candidates of a rendered prompt (OpenAI prompt caching).

A candidate is a prompt position a later request is expected to share up to; on a model with
recurrent state the engine plans a state snapshot at the block boundary at or before it (the
prompt's own end and a ladder back from it are planned anyway). The implicit candidate is the
end of the latest message body, just before its closing token: a next turn that keeps the
history re-renders everything before it identically, while the generation prompt after it
(thinking markup included) may change. Hints never change the prompt or the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ninfer.server.errors import invalid

# Message-closing control tokens of the chat formats we serve (ChatML: Qwen, SmolLM2).
MESSAGE_END_TOKENS = ("<|im_end|>",)
_MODES = ("implicit", "explicit")


def cache_mode(options: Any, param: str = "prompt_cache_options") -> str:
    """The request's write mode: implicit (default) or explicit; 400 on anything else."""
    if options is None:
        return "implicit"
    if not isinstance(options, dict):
        raise invalid("`prompt_cache_options` must be an object", param)
    mode = options.get("mode", "implicit")
    if mode not in _MODES:
        raise invalid(f"`mode` must be one of {', '.join(_MODES)}, got {mode!r}", param + ".mode")
    return mode


MAX_WRITES = 4  # write candidates per request


def check_breakpoint(marker: Any, param: str) -> bool:
    """Whether a content part carries a valid `prompt_cache_breakpoint`; 400 when malformed."""
    if marker is None:
        return False
    if not isinstance(marker, dict) or marker.get("mode") != "explicit":
        raise invalid('`prompt_cache_breakpoint` must be {"mode": "explicit"}', param)
    return True


def cache_candidates(
    prompt_ids: Sequence[int],
    tokenizer: Any,
    mode: str,
    explicit: Sequence[tuple[int, int]] = (),
) -> list[int]:
    """Write candidates for the engine: the latest four explicit breakpoints (exact token
    frontiers from the prompt path), then the implicit one unless the mode is explicit or the
    explicit ones took every slot."""
    chosen = sorted({at for _, at in explicit})[-MAX_WRITES:]
    if mode == "explicit" or len(chosen) >= MAX_WRITES:
        return chosen
    return sorted(set(chosen) | set(_implicit(prompt_ids, tokenizer)))


def _implicit(prompt_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """The end of the latest message body, before its closing token."""
    lookup = getattr(tokenizer, "token_to_id", None)
    if not callable(lookup):
        return []
    ends = {i for i in (lookup(t) for t in MESSAGE_END_TOKENS) if isinstance(i, int)}
    for position in range(len(prompt_ids) - 1, -1, -1):
        if prompt_ids[position] in ends:
            return [position]
    return []
