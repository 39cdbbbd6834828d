"""Speculative rounds beside the prefix cache, pause/replay and grammar masks.

Over the ToyModel (no recurrent state) and a random Qwen3.5 hybrid with an MTP head (GDN
state, snapshots): speculative output equals plain output with the cache on and a hit on a
conversation's second turn, under a pool so small that requests pause and replay, and under a
json_schema constraint (host and device sampling, a constraint that starts after a token).
Proposals come from a draft oracle with injected rejections, so rounds both accept several
tokens and roll back; a leak of a rejected proposal into a cached block or snapshot would
change the next turn's tokens or logits.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import read_header
from ninfer.convert.random import make_random_artifact
from ninfer.tokenizer import Tokenizer
from toy_engine import collect, make_engine, run_one, submit_ok

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _prompt(seed: int, n: int, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _with_rejections(tokens: list[int], every: int, vocab: int) -> list[int]:
    """The continuation with every `every`-th token replaced: rounds accept, then reject."""
    return [(t + 1) % vocab if i % every == every - 1 else t for i, t in enumerate(tokens)]


def _idle_and_consistent(engine) -> dict:
    stats = engine.stats(check_cache=True)
    assert stats["cache_problem"] == ""
    assert stats["running"] == stats["pending"] == stats["paused"] == 0
    # Every page a round took for its proposals came back.
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
    return stats


# --- ToyModel -------------------------------------------------------------------------------


def test_second_turn_hits_the_cache_and_matches_plain_decoding():
    turn1 = _prompt(1, 90)
    plain_engine = make_engine()
    plain1 = run_one(plain_engine, turn1, 100, **GREEDY)
    turn2 = turn1 + plain1.tokens + _prompt(2, 30)
    plain2 = run_one(plain_engine, turn2, 60, **GREEDY)
    _idle_and_consistent(plain_engine)
    plain_engine.shutdown()

    engine = make_engine(ngram_draft_tokens=3)
    spec1 = run_one(
        engine, turn1, 100, draft_oracle=_with_rejections(plain1.tokens, 5, 256), **GREEDY
    )
    assert spec1.tokens == plain1.tokens
    assert 0 < spec1.final.draft_n_accepted < spec1.final.draft_n  # accepted and rejected
    spec2 = run_one(engine, turn2, 60, draft_oracle=plain2.tokens, **GREEDY)
    assert spec2.tokens == plain2.tokens
    # The second turn reuses every full block of turn 1's prompt and answer.
    assert spec2.final.cached_tokens == plain2.final.cached_tokens == (90 + 100) // 64 * 64
    stats = _idle_and_consistent(engine)
    assert stats["prefix_cache"]["hits"] >= 1
    engine.shutdown()


def _contended(spec: dict, oracles: list[list[int]] | None):
    requests = [(_prompt(40 + i, 90 + 17 * i), 150, {"seed": 7 + i}) for i in range(4)]
    engine = make_engine(
        max_concurrency=4, max_context=512, prefill_chunk=32, kv_capacity=640, **spec
    )
    ids = []
    for i, (prompt, n, kw) in enumerate(requests):
        extra = {"draft_oracle": oracles[i]} if oracles else {}
        temperature = 0.9 if i % 2 else 0.0
        ids.append(
            submit_ok(engine, prompt, n, temperature=temperature, ignore_eos=True, **kw, **extra)
        )
    got = collect(engine, ids, timeout=60)
    stats = _idle_and_consistent(engine)
    engine.shutdown()
    return requests, [got[i] for i in ids], stats


@pytest.mark.parametrize("reuse", [True, False])
def test_pause_and_replay_with_speculation_match_an_uncontended_plain_run(reuse):
    alone = make_engine(max_context=512)
    requests = [(_prompt(40 + i, 90 + 17 * i), 150, {"seed": 7 + i}) for i in range(4)]
    want = [
        run_one(alone, p, n, temperature=0.9 if i % 2 else 0.0, ignore_eos=True, **kw)
        for i, (p, n, kw) in enumerate(requests)
    ]
    alone.shutdown()
    oracles = [_with_rejections(w.tokens, 4, 256) for w in want]
    # Submitted one by one: on a busy machine the first requests can run far enough ahead
    # that nothing pauses, so the run is repeated until the pause path was taken.
    for _ in range(5):
        _, outcomes, stats = _contended({"ngram_draft_tokens": 3, "prefix_reuse": reuse}, oracles)
        if stats["pauses"] > 0:
            break
    assert stats["pauses"] > 0
    assert stats["spec_accepted_tokens"] > 0
    for i, (got, expected) in enumerate(zip(outcomes, want, strict=True)):
        assert got.tokens == expected.tokens, i
        assert got.text == expected.text
        # Paused requests report their tokens once.
        assert sum(len(e.token_ids) for e in got.events) == 150


# A byte-level vocabulary for grammar tests (as in test_grammar_mask.py).
PIECES = [chr(c).encode() for c in range(32, 127)] + [b'{"', b'":', b"true", b"false", b"\n"]
EOS = len(PIECES) + 1
TOKEN_BYTES = [*PIECES, b"<|control|>", b"<|eos|>"]
GVOCAB = len(TOKEN_BYTES) + 9
SCHEMA = (
    '{"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},'
    ' "tag": {"type": "string", "maxLength": 6}}, "required": ["ok", "n", "tag"]}'
)


def _grammar_engine(device: bool, **spec):
    options = _core.EngineOptions(max_concurrency=2, max_context=256, eos_ids=[EOS], **spec)
    engine = _core.Engine.toy(GVOCAB, TOKEN_BYTES, options)
    engine.set_grammar_special_ids([len(PIECES)])
    engine.toy_sample_on_device(device)
    return engine


@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_is_the_same_with_speculation(device, temperature):
    prompt = [TOKEN_BYTES.index(b"a"), TOKEN_BYTES.index(b"b")]
    sampling = {"temperature": temperature, "seed": 3}
    plain_engine = _grammar_engine(device)
    plain = run_one(
        plain_engine,
        prompt,
        48,
        constraint=plain_engine.compile_grammar("json_schema", SCHEMA),
        **sampling,
    )
    plain_engine.shutdown()
    assert plain.text.startswith(b'{"ok":'), plain.text

    engine = _grammar_engine(device, ngram_draft_tokens=4)
    grammar = engine.compile_grammar("json_schema", SCHEMA)
    # Every third proposal is wrong (often outside the grammar): masks per verified row and
    # the matcher's rollback on the device path keep the output exact.
    oracle = _with_rejections(plain.tokens, 3, GVOCAB)
    spec = run_one(engine, prompt, 48, constraint=grammar, draft_oracle=oracle, **sampling)
    engine.shutdown()
    assert spec.tokens == plain.tokens
    assert spec.text == plain.text
    assert spec.final.finish_reason == plain.final.finish_reason
    assert spec.final.draft_n_accepted > 0
    assert spec.final.constraint["complete"] == plain.final.constraint["complete"]


@pytest.mark.parametrize("device", [False, True])
def test_a_constraint_that_starts_after_a_token_starts_at_the_same_place(device):
    prompt = [TOKEN_BYTES.index(b"x")]
    free_engine = _grammar_engine(device)
    free = run_one(free_engine, prompt, 12, temperature=0.0)
    start = free.tokens[4]  # a token the unconstrained output reaches early
    plain = run_one(
        free_engine,
        prompt,
        40,
        temperature=0.0,
        constraint=free_engine.compile_grammar("json_schema", SCHEMA),
        constraint_start_after=start,
    )
    free_engine.shutdown()
    engine = _grammar_engine(device, ngram_draft_tokens=4)
    spec = run_one(
        engine,
        prompt,
        40,
        temperature=0.0,
        constraint=engine.compile_grammar("json_schema", SCHEMA),
        constraint_start_after=start,
        draft_oracle=plain.tokens,
    )
    engine.shutdown()
    assert spec.tokens == plain.tokens
    assert spec.final.draft_n_accepted > 0


# --- Qwen3.5 hybrid with an MTP head ----------------------------------------------------------

QWEN = dict(
    architectures=["Qwen3_5ForCausalLM"],
    model_type="qwen3_5_text",
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    vocab_size=400,
    mtp_num_hidden_layers=1,
)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> tuple[Path, list[bytes]]:
    path = make_random_artifact(
        QWEN,
        tmp_path_factory.mktemp("spec_cache") / "q.ninfer",
        seed=8,
        dtype="f32",
        tokenizer="synthetic",
    )
    return path, Tokenizer(read_header(path).resource("tokenizer.json")).token_bytes()


def _qwen_engine(qwen, lanes: int = 1, **options):
    path, table = qwen
    opts = {"max_concurrency": lanes, "max_context": 512, "prefill_chunk": 64} | options
    return _core.Engine.open(str(path), _core.EngineOptions(**opts), table, threads=1)


def _logits(outcome) -> np.ndarray:
    return np.stack([e.logits for e in outcome.events if e.token_ids])


@pytest.mark.parametrize(
    "spec", [{"ngram_draft_tokens": 3}, {"mtp_draft_tokens": 3}], ids=["oracle", "mtp"]
)
def test_hybrid_hit_after_a_speculative_turn_gives_the_logits_of_a_cold_prefill(qwen, spec):
    # Turn 1 ends past the block boundary at 128 (prompt 101 + 60 tokens); its rounds of four
    # step over the boundary, so the endpoint snapshot there comes from the per-token state of
    # a verified slice. Turn 2 extends the conversation and must resume at 128.
    turn1 = _prompt(5, 101, 400)
    cold_engine = _qwen_engine(qwen, prefix_reuse=False)
    cold1 = run_one(cold_engine, turn1, 60, **GREEDY)
    turn2 = turn1 + cold1.tokens + _prompt(6, 20, 400)
    cold2 = run_one(cold_engine, turn2, 8, capture_logits=True, **GREEDY)
    cold_engine.shutdown()

    engine = _qwen_engine(qwen, **spec)
    oracle = (
        {"draft_oracle": _with_rejections(cold1.tokens, 7, 400)}
        if "ngram_draft_tokens" in spec
        else {}
    )
    spec1 = run_one(engine, turn1, 60, **oracle, **GREEDY)
    assert spec1.tokens == cold1.tokens
    spec2 = run_one(engine, turn2, 8, capture_logits=True, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert spec2.final.cached_tokens == 128
    assert spec2.tokens == cold2.tokens
    # Chunked differently from the cold prefill: equal up to fp32 rounding.
    np.testing.assert_allclose(_logits(spec2), _logits(cold2), atol=2e-4, rtol=0)
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
    if oracle:
        assert stats["spec_accepted_tokens"] > 0
        assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]


def test_hybrid_pause_and_replay_with_mtp_match_plain_decoding(qwen):
    requests = [(_prompt(50 + i, 70 + 13 * i, 400), 90) for i in range(3)]
    alone = _qwen_engine(qwen)
    want = [run_one(alone, p, n, **GREEDY).tokens for p, n in requests]
    alone.shutdown()
    for _ in range(5):
        engine = _qwen_engine(
            qwen, lanes=3, kv_capacity=5 * 64, prefill_chunk=32, mtp_draft_tokens=2
        )
        ids = [submit_ok(engine, p, n, **GREEDY) for p, n in requests]
        got = collect(engine, ids, timeout=120)
        stats = engine.stats(check_cache=True)
        engine.shutdown()
        if stats["pauses"] > 0:
            break
    assert stats["pauses"] > 0
    assert [got[i].tokens for i in ids] == want
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
