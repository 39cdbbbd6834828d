"""Rebuild a Hugging Face tokenizer.json from a GGUF file's tokenizer.ggml.* metadata.

Only gpt2-style byte-level BPE vocabularies are supported. The pre-tokenizer follows what
llama.cpp does for the `tokenizer.ggml.pre` name (its regex list, applied one after another,
each splitting the pieces of the previous one and keeping the unmatched gaps as pieces):
that is a Sequence of isolated Splits followed by a regex-free ByteLevel. Note that this is
not what transformers' GGUF loader builds (it always uses the plain GPT-2 regex), which
tokenizes digits differently for e.g. SmolLM2's `smollm` pre-tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

# The regexes are llama.cpp's (llama-vocab.cpp); case-insensitive contractions are spelled out
# as character classes, as llama.cpp does, so that Unicode case folding cannot widen them.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),  # every digit is its own piece, then GPT-2 splitting
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
}
# GGUF spellings that llama.cpp maps onto the same regex lists.
PRE_TOKENIZER_ALIASES = {
    "default": "default",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "phi-2": "gpt2",
    "mpt": "gpt2",
    "olmo": "gpt2",
    "jais": "gpt2",
    "smollm": "smollm",
    "starcoder": "smollm",
    "refact": "smollm",
    "command-r": "smollm",
    "codeshell": "smollm",
    "exaone": "smollm",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "llama-bpe": "llama3",
    "falcon3": "llama3",
    "qwen2": "qwen2",
    "stablelm2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
}

# llama_token_type values in tokenizer.ggml.token_type
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(
    1, 7
)

# Token spellings llama.cpp also treats as end of generation when they are in the vocabulary.
END_OF_GENERATION_SPELLINGS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
)


class GGUFTokenizerError(ValueError):
    pass


def resolve_pre_tokenizer(name: str | None) -> str:
    key = "default" if name is None else name
    if key not in PRE_TOKENIZER_ALIASES:
        known = ", ".join(sorted(PRE_TOKENIZER_ALIASES))
        raise GGUFTokenizerError(
            f"unsupported tokenizer.ggml.pre {name!r}; supported pre-tokenizers: {known}"
        )
    return PRE_TOKENIZER_ALIASES[key]


def pre_tokenizer_json(pre: str) -> dict[str, Any]:
    splits: list[dict[str, Any]] = [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
        for regex in PRE_TOKENIZER_REGEXES[pre]
    ]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": False,
    }
    return {"type": "Sequence", "pretokenizers": [*splits, byte_level]}


def build_tokenizer_json(
    *,
    model: str,
    pre: str | None,
    tokens: list[str],
    token_types: list[int],
    merges: list[str],
    bos_token_id: int | None,
    add_bos_token: bool,
) -> bytes:
    """tokenizer.json content equivalent to llama.cpp's tokenizer for this vocabulary."""
    if model != "gpt2":
        raise GGUFTokenizerError(
            f"unsupported tokenizer.ggml.model {model!r}; only gpt2-style byte-level BPE works"
        )
    pre_name = resolve_pre_tokenizer(pre)
    if len(token_types) != len(tokens):
        token_types = [TOKEN_NORMAL] * len(tokens)
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)  # a duplicate spelling can never be produced anyway
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise GGUFTokenizerError(f"malformed merge {merge!r} in tokenizer.ggml.merges")
        pairs.append([left, right])
    added = [
        {
            "id": token_id,
            "content": tokens[token_id],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": token_types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN),
        }
        for token_id in range(len(tokens))
        if token_types[token_id] in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
    ]
    post_processor: dict[str, Any] = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    if add_bos_token and bos_token_id is not None:
        bos = tokens[bos_token_id]
        post_processor = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [bos_token_id], "tokens": [bos]}},
        }
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer_json(pre_name),
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre_name == "llama3",
            "vocab": vocab,
            "merges": pairs,
        },
    }
    return json.dumps(document, ensure_ascii=False).encode("utf-8")
