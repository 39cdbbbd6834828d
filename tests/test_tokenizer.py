"""ninfer.tokenizer.Tokenizer: encode/decode and the exact bytes of every token."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ninfer.convert.random import make_random_artifact
from ninfer.convert.synthetic_tokenizer import synthetic_token_ids, synthetic_tokenizer_json
from ninfer.tokenizer import Tokenizer, bytes_to_unicode

SAMPLES = [
    "",
    " ",
    "Hello world",
    "naïve café 🙂 déjà vu",
    "中文字符和数字123",
    "x   42\n\n7\tz",
    "def f(x):\n    return x**2  # comment\n",
    "emoji 👍🏽 family 👨‍👩‍👧",
    "\x00\x01\x7f control",
    "<|im_start|>user\nhi<|im_end|>",
    "half <|im_end",
    "I'm",
    "\r\n\r\n",
]


def random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = (
        [chr(c) for c in range(32, 127)]
        + list("\n\t éßø中文字🙂👍🏽\u200d\u0301")
        + ["<|im_end|>", "<think>", "  "]
    )
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def byte_level_with_digits() -> bytes:
    return synthetic_tokenizer_json()


def sentencepiece_style() -> bytes:
    """A small SentencePiece-like BPE: ▁ for spaces, <0xNN> byte fallback, no byte-level map."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    words = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "he",
        "ll",
        "hell",
        "hello",
        "▁hello",
        "▁w",
        "or",
        "▁wor",
        "ld",
        "▁world",
        "a",
        "é",
    ]
    vocab = {p: i for i, p in enumerate(pieces + words)}
    merges = [
        ["h", "e"],
        ["l", "l"],
        ["he", "ll"],
        ["hell", "o"],
        ["▁", "hello"],
        ["▁", "w"],
        ["o", "r"],
        ["▁w", "or"],
        ["▁wor", "ld"],
    ]
    merges = [m for m in merges if "".join(m) in vocab and m[0] in vocab and m[1] in vocab]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, c in enumerate(pieces[:3])
        ],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return json.dumps(document, ensure_ascii=False).encode()


@pytest.mark.parametrize("document", [byte_level_with_digits, sentencepiece_style])
def test_token_bytes_reproduce_the_text(document) -> None:  # noqa: ANN001
    tokenizer = Tokenizer.from_json_bytes(document())
    table = tokenizer.token_bytes()
    assert len(table) == tokenizer.vocab_size
    for text in SAMPLES + random_texts(300, seed=5):
        for allow_special in (True, False):
            ids = tokenizer.encode(text, allow_special=allow_special)
            assert b"".join(table[i] for i in ids) == text.encode(), repr(text)
            assert tokenizer.decode(ids) == text


def test_sentencepiece_pieces_map_to_bytes() -> None:
    tokenizer = Tokenizer.from_json_bytes(sentencepiece_style())
    table = tokenizer.token_bytes()
    assert table[tokenizer.token_to_id("<0x0A>")] == b"\n"
    assert table[tokenizer.token_to_id("▁hello")] == b" hello"
    ids = tokenizer.encode(" hello 🙂")
    assert [tokenizer.id_to_token(i) for i in ids][:1] == ["▁hello"]
    assert tokenizer.id_to_token(ids[-1]) == "<0x82>"  # the emoji went through byte fallback


def test_byte_level_alphabet_is_a_bijection() -> None:
    alphabet = bytes_to_unicode()
    assert sorted(alphabet) == list(range(256))
    assert len(set(alphabet.values())) == 256
    assert all(not c.isspace() for c in alphabet.values())
    assert alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ"


def test_control_tokens_as_text_when_not_allowed() -> None:
    tokenizer = Tokenizer.from_json_bytes(synthetic_tokenizer_json())
    im_end = synthetic_token_ids()["<|im_end|>"]
    assert tokenizer.encode("<|im_end|>") == [im_end]
    plain = tokenizer.encode("<|im_end|>", allow_special=False)
    assert im_end not in plain and len(plain) > 1
    assert tokenizer.decode(plain) == "<|im_end|>"
    assert tokenizer.encode_batch(["a<|im_end|>", "b"], allow_special=False)[0][-1] != im_end


def test_from_artifact(tmp_path: Path) -> None:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 512,
    }
    path = make_random_artifact(config, tmp_path / "r.ninfer")
    tokenizer = Tokenizer.from_artifact(path)
    ids = synthetic_token_ids()
    assert tokenizer.eos_token_ids == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert tokenizer.bos_token_id is None and tokenizer.add_bos_token is False
    assert tokenizer.vocab_size == max(ids.values()) + 1
    assert (
        tokenizer.decode(tokenizer.encode("Hello <think>ok</think>")) == "Hello <think>ok</think>"
    )
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size])


def test_malformed_tokenizer_json_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="invalid tokenizer.json"):
        Tokenizer.from_json_bytes(b'{"model": {"type": "BPE", "vocab": {}, "merges": [["a","b"]]}}')
