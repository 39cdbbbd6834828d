"""Encoding a rendered prompt so that message text can never forge control tokens.

The template's own markup (`<|im_start|>` and the like) must become special tokens, but the
same spelling inside a message is just text the user typed. Contents that would encode
differently with special tokens allowed are located in the rendered prompt, in message
order, and encoded as plain text; everything around them is encoded with specials allowed.
Prompts whose messages hold no special spellings are encoded in one piece, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def encode_rendered_prompt(tokenizer: Any, rendered: str, contents: Sequence[str]) -> list[int]:
    literal = [c for c in contents if c and _has_special_spelling(tokenizer, c)]
    if not literal:
        return tokenizer.encode(rendered, allow_special=True)
    ids: list[int] = []
    cursor = 0
    for content in literal:
        at = rendered.find(content, cursor)
        if at < 0:
            continue  # the template rewrote this text; it is encoded with the markup
        ids += tokenizer.encode(rendered[cursor:at], allow_special=True)
        ids += tokenizer.encode(content, allow_special=False)
        cursor = at + len(content)
    return ids + tokenizer.encode(rendered[cursor:], allow_special=True)


def _has_special_spelling(tokenizer: Any, text: str) -> bool:
    return tokenizer.encode(text, allow_special=True) != tokenizer.encode(text, allow_special=False)
