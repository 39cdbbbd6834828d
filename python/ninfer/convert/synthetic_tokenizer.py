"""A small deterministic byte-level BPE tokenizer.json and a ChatML template for random models.

Built from fixed data (no training), so the same bytes come out on every machine and version:
256 byte tokens (id = byte value), merges that spell a fixed list of common fragments, then
ChatML control tokens and the think/tool-call markers as added tokens.
"""

from __future__ import annotations

import json
from typing import Any

from ninfer.tokenizer import bytes_to_unicode

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
_FRAGMENTS = (
    " the",
    " and",
    " to",
    " of",
    " a",
    " in",
    " is",
    " you",
    " that",
    " it",
    " for",
    " on",
    " with",
    " as",
    " are",
    " this",
    " be",
    " have",
    " not",
    " can",
    " will",
    " what",
    " hello",
    " world",
    " model",
    " token",
    " user",
    " assistant",
    " system",
    "ing",
    "ed",
    "er",
    "es",
    "ion",
    "ly",
    "Hello",
    "The",
    "I",
    "\n\n",
    "  ",
    "    ",
    " {",
    " }",
    "()",
    " =",
    " def",
    " return",
    " print",
    " function",
    " import",
    " 0",
    " 1",
    "00",
    ' "',
    '":',
    " .",
    ".\n",
)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _merges() -> tuple[dict[str, int], list[list[str]]]:
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    merges: list[list[str]] = []
    for fragment in _FRAGMENTS:
        symbols = [alphabet[b] for b in fragment.encode("utf-8")]
        merged = symbols[0]
        for symbol in symbols[1:]:
            if merged + symbol not in vocab:
                merges.append([merged, symbol])
                vocab[merged + symbol] = len(vocab)
            merged += symbol
    return vocab, merges


def synthetic_tokenizer_json() -> bytes:
    vocab, merges = _merges()
    added: list[dict[str, Any]] = []
    for content in (*SPECIAL_TOKENS, *MARKER_TOKENS):
        added.append(
            {
                "id": len(vocab) + len(added),
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": content in SPECIAL_TOKENS,
            }
        )
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return json.dumps(document, ensure_ascii=False, indent=1).encode("utf-8")


def synthetic_token_ids() -> dict[str, int]:
    """Ids of the added tokens of `synthetic_tokenizer_json()`."""
    added = json.loads(synthetic_tokenizer_json())["added_tokens"]
    return {token["content"]: token["id"] for token in added}
