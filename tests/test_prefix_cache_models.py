"""Prefix-cache hits on real (random-weight) models, CPU fp32: the logits after a hit equal a
cold prefill's, for a dense Llama (KV blocks alone) and a Qwen3.5 hybrid (KV blocks plus the
GDN state snapshot at the hit), at block boundaries and for prompts that end mid-block."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import read_header
from ninfer.convert.random import make_random_artifact
from ninfer.engine import core_options
from ninfer.engine_types import EngineConfig
from ninfer.tokenizer import Tokenizer
from toy_engine import run_one

GREEDY = {"temperature": 0.0, "ignore_eos": True, "capture_logits": True}

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "max_position_embeddings": 1024,
}


def _engine(artifact: Path, **config) -> object:
    cfg = EngineConfig(**({"max_context": 512, "threads": 1, "prefill_chunk": 256} | config))
    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    return _core.Engine.open(str(artifact), core_options(cfg, []), table, threads=cfg.threads)


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _logits(outcome) -> np.ndarray:
    rows = [e.logits for e in outcome.events if e.token_ids]
    assert all(r is not None for r in rows)
    return np.stack(rows)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_artifact(
        LLAMA, tmp_path_factory.mktemp("prefix") / "llama.ninfer", seed=11, dtype="f32"
    )


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from qwen3_5_cases import build_artifact

    return build_artifact("qwen3_5", tmp_path_factory.mktemp("prefix_qwen"), seed=5)[1]


def test_dense_hit_gives_the_logits_of_a_cold_prefill(llama: Path) -> None:
    vocab = LLAMA["vocab_size"]
    aligned = _prompt(1, 150, vocab)
    mid_block = aligned[:100] + _prompt(2, 37, vocab)  # shares one block, ends mid-block
    cold_engine = _engine(llama, prefix_reuse=False)
    cold = {len(p): run_one(cold_engine, p, 6, **GREEDY) for p in (aligned, mid_block)}
    cold_engine.shutdown()

    engine = _engine(llama)
    first = run_one(engine, aligned, 6, **GREEDY)
    hit = run_one(engine, aligned, 6, **GREEDY)
    partial = run_one(engine, mid_block, 6, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert (first.final.cached_tokens, hit.final.cached_tokens) == (0, 128)
    assert partial.final.cached_tokens == 64
    for got, want in ((first, cold[150]), (hit, cold[150]), (partial, cold[137])):
        assert got.tokens == want.tokens
        # Bit-identical on CPU fp32: every later decode step too.
        assert np.array_equal(_logits(got), _logits(want))
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_hybrid_hit_resumes_from_the_state_snapshot(qwen: Path) -> None:
    from qwen3_5_cases import VOCAB

    prompt = _prompt(3, 150, VOCAB)
    cold_engine = _engine(qwen, prefix_reuse=False)
    cold = run_one(cold_engine, prompt, 6, **GREEDY)
    cold_engine.shutdown()

    engine = _engine(qwen)
    first = run_one(engine, prompt, 6, **GREEDY)  # the prompt-end tap at 128
    hit = run_one(engine, prompt, 6, **GREEDY)
    # A prompt that shares only the first block finds no snapshot there: no reuse.
    no_snapshot = run_one(engine, prompt[:100] + _prompt(4, 20, VOCAB), 2, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert (first.final.cached_tokens, hit.final.cached_tokens) == (0, 128)
    assert no_snapshot.final.cached_tokens == 0
    # The hit replays exactly what the first request computed after its tap.
    assert np.array_equal(_logits(hit), _logits(first))
    assert hit.tokens == first.tokens == cold.tokens
    # A cold prefill in one chunk differs from the tapped split only by fp32 rounding.
    np.testing.assert_allclose(_logits(hit), _logits(cold), atol=2e-4, rtol=0)
    cache = stats["prefix_cache"]
    assert cache["taps_created"] >= 1 and cache["snapshot_hits"] == 1
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_hybrid_follow_up_turn_resumes_from_the_answer_endpoint(qwen: Path) -> None:
    from qwen3_5_cases import VOCAB

    prompt = _prompt(5, 100, VOCAB)
    engine = _engine(qwen)
    answer = run_one(engine, prompt, 60, **GREEDY)  # decode crosses position 128
    turn2 = prompt + answer.tokens[:40] + _prompt(6, 20, VOCAB)
    follow = run_one(engine, turn2, 4, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    cold_engine = _engine(qwen, prefix_reuse=False)
    cold = run_one(cold_engine, turn2, 4, **GREEDY)
    cold_engine.shutdown()
    assert stats["prefix_cache"]["endpoints_created"] >= 1
    assert follow.final.cached_tokens == 128
    assert follow.tokens == cold.tokens
    np.testing.assert_allclose(_logits(follow), _logits(cold), atol=2e-4, rtol=0)
    assert stats["cache_problem"] == ""


def test_hybrid_pause_and_replay_keep_the_outputs(qwen: Path) -> None:
    from qwen3_5_cases import VOCAB

    prompts = [_prompt(20 + i, 60 + 9 * i, VOCAB) for i in range(3)]
    alone_engine = _engine(qwen)
    alone = [run_one(alone_engine, p, 70, temperature=0.0, ignore_eos=True).tokens for p in prompts]
    alone_engine.shutdown()
    # Three requests growing to ~3 pages each in a 5-page pool: younger ones pause and replay.
    engine = _engine(qwen, max_concurrency=3, kv_capacity=320, max_context=320, prefill_chunk=64)
    ids = [engine.submit(p, 70, temperature=0.0, ignore_eos=True).request_id for p in prompts]
    from toy_engine import collect

    got = collect(engine, ids, timeout=120)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert stats["pauses"] > 0
    assert [got[i].tokens for i in ids] == alone
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
    assert stats["cache_problem"] == ""


def test_hybrid_cache_candidate_plants_a_snapshot_where_a_later_prompt_diverges(
    qwen: Path,
) -> None:
    from qwen3_5_cases import VOCAB

    prompt = _prompt(30, 200, VOCAB)
    later = prompt[:150] + _prompt(31, 30, VOCAB)  # diverges at 150
    plain = _engine(qwen)
    run_one(plain, prompt, 2, temperature=0.0, ignore_eos=True)  # taps at 192 only
    assert run_one(plain, later, 2, temperature=0.0).final.cached_tokens == 0
    plain.shutdown()
    hinted = _engine(qwen)
    run_one(hinted, prompt, 2, temperature=0.0, ignore_eos=True, cache_candidates=[140])
    assert run_one(hinted, later, 2, temperature=0.0).final.cached_tokens == 128
    assert hinted.stats(check_cache=True)["prefix_cache"]["taps_created"] >= 2
    hinted.shutdown()


def test_hybrid_eviction_keeps_blocks_that_end_in_a_snapshot(qwen: Path) -> None:
    from qwen3_5_cases import VOCAB

    # 8 pages; one prefill snapshot per request. Y's last block holds its snapshot; X (newer)
    # is hinted at 70, so its last block has none and cannot be resumed from: under pressure
    # it goes before Y's older one, which plain LRU would have taken.
    engine = _engine(qwen, kv_capacity=512, max_context=512, taps_per_request=1)
    y, x, z = _prompt(40, 200, VOCAB), _prompt(41, 200, VOCAB), _prompt(42, 130, VOCAB)
    run_one(engine, y, 1, temperature=0.0)
    run_one(engine, x, 1, temperature=0.0, cache_candidates=[70])
    run_one(engine, z, 1, temperature=0.0)  # needs one more page than is free
    assert engine.stats(check_cache=True)["prefix_cache"]["evicted_blocks"] == 1
    assert run_one(engine, y, 1, temperature=0.0).final.cached_tokens == 192
    assert run_one(engine, x, 1, temperature=0.0).final.cached_tokens == 64
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
