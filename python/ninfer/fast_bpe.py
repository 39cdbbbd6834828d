"""A tiktoken encoder equivalent to a tokenizer.json, for the prompts' hot path.

`tokenizers` spends about 5 µs a token on a Qwen-style byte-level BPE (40 ms for an 8k-token
prompt, nearly all of the time between a request's arrival and its prefill); tiktoken encodes
the same text in 1–3 ms. Both are exact for the tokenizers where they agree by construction,
so a tiktoken encoder is only built when the tokenizer.json is one of them:

- a byte-level BPE (no byte fallback, dropout, subword prefix or suffix) with `ignore_merges`,
  so a pre-token that is a whole vocabulary entry is taken as it is, as tiktoken does;
- one `Split` regex (isolated) followed by `ByteLevel` without its own regex or prefix space;
- no normalizer or NFC (the caller falls back for text that NFC would change);
- every merge joins two entries into the entry of the next rank or later (merge order =
  the merged entry's id order), and the merges are exactly the splits of every entry into two
  entries, so "merge the lowest-ranked adjacent pair that is an entry" is the same rule;
- added tokens without strip or single-word options, none a prefix of another (tiktoken
  matches them leftmost-first, `tokenizers` leftmost-longest).

The rebuilt Qwen3.5/3.6 tokenizer (prompt.qwen_tokenizer) is of this kind. Anything else, or
tiktoken not installed, gives None and the caller keeps `tokenizers`.

Where the two can still differ, and the guard (`GuardedEncoder`). Both merge, step by step, a
pair of the lowest priority; tiktoken's priority is the merged entry's rank, `tokenizers`'
the merge's index, which orders the same way except between different splits of one entry
(`ab·a` and `a·ba` both make `aba`). tiktoken breaks that tie by position (leftmost),
`tokenizers` by merge index, so `ab·a·ba` can end as `aba·ba` in one and `ab·aba` in the other,
and a tie between distant pairs can change which later merges happen. When every tie a run
meets is between equal merges, both pick the leftmost and stay identical step by step. A tie
between different splits needs two occurrences of one entry (length >= 2) at two offsets of
one pre-token, so that pre-token repeats a byte pair. The guard therefore splits the text into
pre-tokens itself (the same regex, `regex` module), and for every pre-token that is not a
whole entry and repeats a byte pair (runs of spaces, dashes, repeated syllables, CJK runs)
compares tiktoken's encoding of it with `tokenizers`' own BPE; any difference sends the whole
text to `tokenizers`. Verdicts are cached per pre-token, so a repeated system prompt pays once.
No difference has been seen (tests/test_fast_bpe.py: hypothesis, real agent requests, ~0.5 M
fuzzed strings), but the guard makes the fast path exact without relying on that.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


def tiktoken_encoding(
    spec: dict[str, Any], alphabet: dict[str, int], digest: str | None = None
) -> Any | None:
    """A `tiktoken.Encoding` that encodes as tokenizer.json `spec` does up to ties between
    different merges of one entry (GuardedEncoder checks those), or None.
    `alphabet`: the byte-level character → byte table. `digest`: a hash of the tokenizer.json
    document; the merge-order check (seconds on a 250k vocabulary) is then done once per
    document and machine, its pass remembered in the cache directory."""
    try:
        import tiktoken
    except ImportError:
        return None
    pattern = _split_pattern(spec)
    model = spec.get("model") or {}
    if pattern is None or not _plain_byte_level_bpe(model):
        return None
    if (spec.get("normalizer") or {"type": "NFC"}).get("type") != "NFC":
        return None
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added):
        return None
    spellings = [t["content"] for t in added]
    if any(a != b and b.startswith(a) for a in spellings for b in spellings):
        return None
    vocab = model.get("vocab") or {}
    marker = _verdict_marker(digest)
    if marker is None or not marker.is_file():
        if not _merges_are_rank_order(model.get("merges") or [], vocab):
            return None
        if marker is not None:
            with contextlib.suppress(OSError):
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text("merges are every two-entry split, in rank order\n")
    ranks = _ranks(vocab, alphabet)
    if ranks is None:
        return None
    special = {t["content"]: int(t["id"]) for t in added}
    if set(special.values()) & set(ranks.values()):
        return None
    try:
        return tiktoken.Encoding(
            "ninfer-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special
        )
    except Exception:  # a regex tiktoken's engine does not take
        return None


def _verdict_marker(digest: str | None) -> Path | None:
    if digest is None:
        return None
    from ninfer.default_model import cache_dir

    return cache_dir() / "fast-bpe" / f"v{_CHECK_VERSION}-{digest}.ok"


# Bump when _merges_are_rank_order changes, so remembered passes are not reused.
_CHECK_VERSION = 1


def _split_pattern(spec: dict[str, Any]) -> str | None:
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers") or []) != 2:
        return None
    split, byte_level = pre["pretokenizers"]
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or "Regex" not in (split.get("pattern") or {})
    ):
        return None
    if (
        byte_level.get("type") != "ByteLevel"
        or byte_level.get("add_prefix_space")
        or byte_level.get("use_regex", True)
    ):
        return None
    return str(split["pattern"]["Regex"])


def _plain_byte_level_bpe(model: dict[str, Any]) -> bool:
    return (
        model.get("type") == "BPE"
        and bool(model.get("ignore_merges"))
        and not model.get("byte_fallback")
        and not model.get("dropout")
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
    )


def _ranks(vocab: dict[str, int], alphabet: dict[str, int]) -> dict[bytes, int] | None:
    ranks: dict[bytes, int] = {}
    try:
        for piece, token_id in vocab.items():
            ranks[bytes([alphabet[c] for c in piece])] = int(token_id)
    except KeyError:  # a character outside the byte-level alphabet
        return None
    if len(ranks) != len(vocab) or any(bytes([b]) not in ranks for b in range(256)):
        return None
    return ranks


def _merges_are_rank_order(merges: list[Any], vocab: dict[str, int]) -> bool:
    """Merge i yields an entry whose rank never decreases with i, and the merges are all the
    two-entry splits of every entry (so both encoders consider the same pairs). Checked on the
    byte-level spellings: one character per byte, so their splits are the bytes' splits."""
    last = -1
    pairs: set[tuple[str, str]] = set()
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(left + right)
        if rank is None or rank < last or left not in vocab or right not in vocab:
            return False
        last = rank
        pairs.add((left, right))
    if len(pairs) != len(merges):
        return False
    splits = 0
    for token in vocab:
        for cut in range(1, len(token)):
            if token[:cut] in vocab and token[cut:] in vocab:
                splits += 1
    return splits == len(merges)


# The check runs beside tiktoken only where a core is likely free: on a 2-core machine the
# hand-off to a second thread cost more (waiting to be scheduled) than the check itself.
_SPARE_CORES = (os.cpu_count() or 1) >= 4


@functools.cache
def _guard_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ninfer-bpe-guard")


def guarded_encoder(
    spec: dict[str, Any],
    alphabet: dict[str, int],
    reference_bpe: Callable[[str], list[int]],
    digest: str | None = None,
) -> GuardedEncoder | None:
    """The exact fast encoder for tokenizer.json `spec`, or None where there is none."""
    encoding = tiktoken_encoding(spec, alphabet, digest)
    if encoding is None:
        return None
    pattern = _split_pattern(spec)
    assert pattern is not None  # tiktoken_encoding checked it
    spelling = {byte: char for char, byte in alphabet.items()}
    special = [t["content"] for t in spec.get("added_tokens") or []]
    return GuardedEncoder(encoding, pattern, spelling, reference_bpe, special)


class GuardedEncoder:
    """tiktoken's encoding of a text, checked against `tokenizers` on the pre-tokens where a
    tie between different merges could make them differ (module docstring).

    `reference_bpe(spelling)`: `tokenizers`' BPE of one pre-token given in byte-level
    spelling (the model's `tokenize`); `special`: spellings tiktoken treats as control tokens.
    """

    _CACHE_LIMIT = 1 << 16
    _PARALLEL_CHARS = 4096  # below this a thread hand-off costs more than it saves

    def __init__(
        self,
        encoding: Any,
        pattern: str,
        byte_spelling: dict[int, str],
        reference_bpe: Callable[[str], list[int]],
        special: list[str],
    ) -> None:
        import re

        import regex

        self.encoding = encoding
        self.pattern = pattern
        self._split = regex.compile(pattern).findall
        self._special = (
            re.compile("|".join(re.escape(s) for s in sorted(special, key=len, reverse=True)))
            if special
            else None
        )
        self._spelling = str.maketrans({chr(b): c for b, c in byte_spelling.items()})
        self._reference_bpe = reference_bpe
        # Whole entries as text (those that are valid UTF-8): a pre-token that is one of them
        # is taken whole by both encoders and needs no check.
        self._whole: set[str] = set()
        for entry in encoding._mergeable_ranks:
            try:
                self._whole.add(entry.decode("utf-8"))
            except UnicodeDecodeError:
                pass
        self._verdicts: dict[str, bool] = {}
        self._lock = threading.Lock()
        self.checked_pieces = 0  # pre-tokens compared with `tokenizers` (tests read it)

    def encode(self, text: str, *, allow_special: bool) -> list[int] | None:
        """The token ids, or None where `tokenizers` must encode `text` (a checked pre-token
        differed)."""
        if len(text) < self._PARALLEL_CHARS or not _SPARE_CORES:
            if not self._pieces_agree(text, allow_special):
                return None
            return self._encode(text, allow_special)
        # Both the regex split (concurrent=True) and tiktoken release the GIL: on a host with
        # a spare core the check costs no latency.
        check = _guard_pool().submit(self._pieces_agree, text, allow_special)
        ids = self._encode(text, allow_special)
        return ids if check.result() else None

    def _encode(self, text: str, allow_special: bool) -> list[int]:
        if allow_special:
            return self.encoding.encode(text, allowed_special="all")
        return self.encoding.encode_ordinary(text)

    def _pieces_agree(self, text: str, allow_special: bool) -> bool:
        if allow_special and self._special is not None:
            pieces = set().union(
                *(self._split(s, concurrent=True) for s in self._special.split(text))
            )
        else:
            pieces = set(self._split(text, concurrent=True))
        pieces = pieces.difference(self._whole)  # iterates the pieces, not the vocabulary
        verdicts = self._verdicts
        for piece in pieces:
            verdict = verdicts.get(piece)
            if verdict is None:
                verdict = self._check(piece)
            if not verdict:
                return False
        return True

    def _check(self, piece: str) -> bool:
        raw = piece.encode("utf-8")
        pairs = len(raw) - 1
        if pairs < 2 or len({raw[i : i + 2] for i in range(pairs)}) == pairs:
            verdict = True  # no byte pair twice: no tie between different merges
        else:
            spelled = raw.decode("latin-1").translate(self._spelling)
            verdict = self.encoding._encode_single_piece(raw) == self._reference_bpe(spelled)
            self.checked_pieces += 1
        with self._lock:
            if len(self._verdicts) >= self._CACHE_LIMIT:
                self._verdicts.clear()
            self._verdicts[piece] = verdict
        return verdict
