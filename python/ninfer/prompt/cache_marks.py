"""Explicit prefix-cache breakpoints as exact rendered-token frontiers.

A protocol that lowers a content block carrying a breakpoint (Anthropic `cache_control`,
OpenAI `prompt_cache_breakpoint`) appends `mark(n)` to the block's text. The prompt path takes
the marks out before anything else sees the content (`take_marks`), renders the clean
conversation as usual, and renders it once more with the marks put back to learn where each
block ends in the rendered text (`frontiers`). A mark becomes a write candidate only when
that position is an exact token boundary: the tokens of the text before it are a prefix of
the prompt's tokens. The second render must equal the first once its marks are removed; when
a template reshapes the content around a mark (trimming, escaping), every mark of the
request is ignored. The prompt itself never changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

_OPEN, _CLOSE = "\uffff\u2064ninfer-cache-mark-", "\u2064\uffff"
_PATTERN = re.compile(re.escape(_OPEN) + r"(\d+)" + re.escape(_CLOSE))


def mark(n: int) -> str:
    """The text appended to the end of breakpoint `n`'s block."""
    return f"{_OPEN}{n}{_CLOSE}"


def take_marks(messages: Sequence[Any]) -> list[tuple[int, int, int]]:
    """Removes every mark from the messages' `content` in place; returns (message index,
    offset in the clean content, mark number) for each, in prompt order."""
    found: list[tuple[int, int, int]] = []
    for index, message in enumerate(messages):
        content = message.content
        if _OPEN not in content:
            continue
        clean: list[str] = []
        at = 0
        length = 0
        for match in _PATTERN.finditer(content):
            clean.append(content[at : match.start()])
            length += match.start() - at
            found.append((index, length, int(match.group(1))))
            at = match.end()
        clean.append(content[at:])
        message.content = "".join(clean)
    return found


def with_marks(content: str, marks: Sequence[tuple[int, int]]) -> str:
    """`content` with mark `n` put back at each (offset, n)."""
    out, at = [], 0
    for offset, n in sorted(marks):
        out.append(content[at:offset])
        out.append(mark(n))
        at = offset
    out.append(content[at:])
    return "".join(out)


def frontiers(
    marked_render: str,
    clean_render: str,
    ids: Sequence[int],
    encode: Callable[[str], list[int]],
) -> list[tuple[int, int]]:
    """(mark number, prompt tokens before it) for the marks at exact token boundaries, in
    prompt order; empty when the marks changed the render."""
    positions: list[tuple[int, int]] = []
    pieces, at, removed = [], 0, 0
    for match in _PATTERN.finditer(marked_render):
        pieces.append(marked_render[at : match.start()])
        positions.append((match.start() - removed, int(match.group(1))))
        removed += match.end() - match.start()
        at = match.end()
    pieces.append(marked_render[at:])
    if "".join(pieces) != clean_render:
        return []
    out: list[tuple[int, int]] = []
    for offset, n in positions:
        if offset <= 0 or offset > len(clean_render):
            continue
        before = encode(clean_render[:offset])
        if 0 < len(before) <= len(ids) and list(ids[: len(before)]) == before:
            out.append((n, len(before)))
    return out
