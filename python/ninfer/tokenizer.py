"""Tokenizer facade over HF `tokenizers`, plus the exact byte string of every token id.

Encoding runs in `tokenizers` (Rust, releases the GIL). Decoding goes through `token_bytes()`,
the same id → bytes table the native core uses for stop strings and grammars, so Python and
the core always agree on what a token spells.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from ninfer.fast_bpe import GuardedEncoder, guarded_encoder


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable unicode character.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to U+0100
    onward in byte order, so no token string contains whitespace or control characters.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


@functools.cache
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _has_component(node: Any, type_name: str) -> bool:
    """Whether a tokenizer.json component tree contains a component of `type_name`."""
    if isinstance(node, dict):
        return node.get("type") == type_name or any(
            _has_component(v, type_name) for v in node.values()
        )
    if isinstance(node, list):
        return any(_has_component(v, type_name) for v in node)
    return False


def _byte_fallback_value(piece: str) -> int | None:
    """NN of a SentencePiece byte token spelled <0xNN>, else None."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return int(piece[3:5], 16)
        except ValueError:
            return None
    return None


class Tokenizer:
    """Encode text to ids and map ids to their exact bytes.

    `encode` never adds BOS/EOS (templates and the prompt builder decide that, using
    `add_bos_token` and `bos_token_id`).
    """

    def __init__(
        self,
        document: bytes,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        add_bos_token: bool = False,
    ) -> None:
        try:
            text = document.decode("utf-8")
            self._tokenizer = _HFTokenizer.from_str(text)
            self._spec: dict[str, Any] = json.loads(text)
            # A second instance without added tokens treats every control-token spelling as
            # text, including added tokens not flagged special (Qwen's `<tool_call>`,
            # `<think>`), which `encode_special_tokens` would still match.
            self._plain = _HFTokenizer.from_str(json.dumps({**self._spec, "added_tokens": []}))
        except Exception as e:  # tokenizers raises a bare Exception for bad documents
            raise ValueError(f"invalid tokenizer.json: {e}") from e
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.add_bos_token = add_bos_token
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        self._token_bytes: list[bytes] | None = None
        # The same encoding through tiktoken where it is exact (fast_bpe): ~15x faster. Its
        # exactness check takes seconds on a 250k vocabulary, so it runs beside startup and
        # encode() uses `tokenizers` until it is done.
        self._fast: GuardedEncoder | None = None
        self._nfc = (self._spec.get("normalizer") or {}).get("type") == "NFC"
        self._fast_done = threading.Event()
        self._digest = hashlib.sha256(document).hexdigest()[:32]
        threading.Thread(target=self._build_fast, name="ninfer-fast-bpe", daemon=True).start()

    @classmethod
    def from_json_bytes(cls, document: bytes, **header: Any) -> Tokenizer:
        """From tokenizer.json content; `header`: bos_token_id, eos_token_ids, add_bos_token."""
        return cls(document, **header)

    @classmethod
    def from_artifact(cls, path: str | os.PathLike[str]) -> Tokenizer:
        from ninfer.artifact import read_header

        info = read_header(path)
        section = info.header.get("tokenizer") or {}
        return cls(
            info.resource("tokenizer.json"),
            bos_token_id=section.get("bos_token_id"),
            eos_token_ids=section.get("eos_token_ids") or [],
            add_bos_token=bool(section.get("add_bos_token", False)),
        )

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Token ids of `text`; with allow_special=False control-token spellings are plain text."""
        if self._fast is not None and self._fast_applies(text):
            ids = self._fast.encode(text, allow_special=allow_special)
            if ids is not None:
                return ids
        tokenizer = self._tokenizer if allow_special else self._plain
        return tokenizer.encode(text, add_special_tokens=False).ids

    def _build_fast(self) -> None:
        try:
            model = self._tokenizer.model
            self._fast = guarded_encoder(
                self._spec,
                unicode_to_bytes(),
                lambda spelling: [token.id for token in model.tokenize(spelling)],
                self._digest,
            )
        finally:
            self._fast_done.set()

    def wait_fast_encoder(self, timeout: float | None = None) -> bool:
        """Waits for the tiktoken check (see __init__); whether the fast encoder is in use."""
        self._fast_done.wait(timeout)
        return self._fast is not None

    def _fast_applies(self, text: str) -> bool:
        """tiktoken agrees on text the normalizer keeps as it is and that is valid UTF-8
        (tiktoken would replace a lone surrogate, `tokenizers` refuses it)."""
        if text.isascii():
            return True
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            return False
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    def added_token_spellings(self) -> list[str]:
        """The spellings of tokenizer.json's added tokens (the control tokens)."""
        return [t["content"] for t in self._spec.get("added_tokens") or [] if t.get("content")]

    def special_token_ids(self) -> list[int]:
        """Ids of the added tokens flagged special (control tokens, not text)."""
        return [t["id"] for t in self._spec.get("added_tokens") or [] if t.get("special")]

    def encode_batch(self, texts: Sequence[str], *, allow_special: bool = True) -> list[list[int]]:
        tokenizer = self._tokenizer if allow_special else self._plain
        return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text the ids spell; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        table = self.token_bytes()
        out = []
        for i in ids:
            if not 0 <= i < len(table):
                raise ValueError(f"token id {i} outside the vocabulary (size {len(table)})")
            out.append(table[i])
        return b"".join(out)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def token_bytes(self) -> list[bytes]:
        """Exact bytes of every id in [0, vocab_size); ids the vocabulary skips map to b""."""
        if self._token_bytes is None:
            self._token_bytes = self._build_token_bytes()
        return self._token_bytes

    def _build_token_bytes(self) -> list[bytes]:
        added = {t["id"]: t["content"] for t in self._spec.get("added_tokens") or []}
        model = self._spec.get("model") or {}
        byte_level = _has_component(self._spec.get("pre_tokenizer"), "ByteLevel") or _has_component(
            self._spec.get("decoder"), "ByteLevel"
        )
        byte_fallback = bool(model.get("byte_fallback")) or _has_component(
            self._spec.get("decoder"), "ByteFallback"
        )
        alphabet = unicode_to_bytes()
        table: list[bytes] = []
        for token_id in range(self.vocab_size):
            piece = self._tokenizer.id_to_token(token_id)
            if piece is None:
                table.append(b"")
            elif token_id in added:
                table.append(added[token_id].encode("utf-8"))
            elif byte_level and all(c in alphabet for c in piece):
                table.append(bytes(alphabet[c] for c in piece))
            elif byte_fallback and _byte_fallback_value(piece) is not None:
                table.append(bytes([_byte_fallback_value(piece)]))
            else:  # SentencePiece-style pieces mark spaces with U+2581
                table.append(piece.replace("\u2581", " ").encode("utf-8"))
        return table
