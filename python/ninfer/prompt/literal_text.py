"""Encoding a rendered prompt so that request text can never forge control tokens.

The template's own markup (`<|im_start|>` and the like) must become special tokens, but the
same spelling inside a message, a tool definition or a template kwarg is just text the
client sent. Before rendering, every request string that contains a control-token spelling
is swapped for a unique placeholder (keeping its leading and trailing whitespace outside the
placeholder, so a template's `trim` behaves the same); after rendering, the text between
placeholders is encoded with specials allowed and each placeholder's original is encoded as
plain text. Requests without such spellings render and encode exactly as before, in one piece.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def special_spellings(tokenizer: Any) -> tuple[str, ...]:
    """Spellings of the tokenizer's control tokens (empty when it cannot say)."""
    spellings = getattr(tokenizer, "added_token_spellings", None)
    if callable(spellings):
        return tuple(s for s in spellings() if s)
    specials = getattr(tokenizer, "SPECIALS", None)
    return tuple(specials) if isinstance(specials, Mapping) else ()


@dataclass(slots=True)
class LiteralText:
    """Collects literal strings while a request is prepared, then encodes the render."""

    tokenizer: Any
    spellings: tuple[str, ...]
    _nonce: str = field(default_factory=lambda: secrets.token_hex(4))
    _originals: list[str] = field(default_factory=list)

    def needs_literal(self, text: str) -> bool:
        if self.spellings:
            return any(s in text for s in self.spellings)
        return self.tokenizer.encode(text, allow_special=True) != self.tokenizer.encode(
            text, allow_special=False
        )

    def protect(self, text: str, *, rendered_as_json: bool = False) -> str:
        """`text`, or a placeholder for it when it holds a control-token spelling.
        `rendered_as_json`: the template prints this string through `tojson` (tool data)."""
        if not isinstance(text, str) or not self.needs_literal(text):
            return text
        core = text.strip()
        lead = text[: len(text) - len(text.lstrip())]
        trail = text[len(text.rstrip()) :] if core else ""
        original = json.dumps(core, ensure_ascii=False)[1:-1] if rendered_as_json else core
        self._originals.append(original)
        return f"{lead}\ue000{self._nonce}.{len(self._originals) - 1}\ue001{trail}"

    def protect_tree(self, value: Any, *, rendered_as_json: bool) -> Any:
        """A copy of a JSON-like value with its string values protected (keys untouched);
        member order is preserved."""
        if isinstance(value, str):
            return self.protect(value, rendered_as_json=rendered_as_json)
        if isinstance(value, Mapping):
            return {
                k: self.protect_tree(v, rendered_as_json=rendered_as_json) for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.protect_tree(v, rendered_as_json=rendered_as_json) for v in value]
        return value

    @property
    def active(self) -> bool:
        return bool(self._originals)

    def _pattern(self) -> re.Pattern[str]:
        return re.compile("\ue000" + re.escape(self._nonce) + r"\.(\d+)\ue001")

    def restore(self, rendered: str) -> str:
        """The rendered text with every placeholder replaced by its original."""
        if not self._originals:
            return rendered
        return self._pattern().sub(lambda m: self._originals[int(m.group(1))], rendered)

    def encode(self, rendered: str) -> list[int]:
        """Token ids of a render that may hold placeholders."""
        encode: Callable[..., list[int]] = self.tokenizer.encode
        if not self._originals:
            return encode(rendered, allow_special=True)
        ids: list[int] = []
        cursor = 0
        for match in self._pattern().finditer(rendered):
            ids += encode(rendered[cursor : match.start()], allow_special=True)
            ids += encode(self._originals[int(match.group(1))], allow_special=False)
            cursor = match.end()
        return ids + encode(rendered[cursor:], allow_special=True)
