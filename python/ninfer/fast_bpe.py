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
"""

from __future__ import annotations

from typing import Any


def tiktoken_encoding(spec: dict[str, Any], alphabet: dict[str, int]) -> Any | None:
    """A `tiktoken.Encoding` that encodes exactly as tokenizer.json `spec` does, or None.
    `alphabet`: the byte-level character → byte table."""
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
    if not _merges_are_rank_order(model.get("merges") or [], vocab):
        return None
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
