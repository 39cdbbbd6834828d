"""Prefix-cache hits on the CUDA backend (marked `gpu`, tools/gpu/prefix_check.sh): the logits
after a hit match a cold prefill's within bf16 rounding and pick the same tokens, for a dense
Llama and a Qwen3.5 hybrid random model; pause and replay under a tiny pool keep greedy output;
the prefix cache file restores KV pages and state snapshots from device memory."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.convert.random import make_random_artifact
from toy_engine import collect, run_one

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device"),
]

GREEDY = {"temperature": 0.0, "ignore_eos": True, "capture_logits": True}
HYBRID = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=128,
    intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
    linear_value_head_dim=32, vocab_size=400, mtp_num_hidden_layers=0,
)  # fmt: skip
LLAMA = dict(
    architectures=["LlamaForCausalLM"], hidden_size=256, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=400,
    rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=2048,
)  # fmt: skip
VOCAB = 400


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def artifact(request, tmp_path_factory) -> Path:
    return make_random_artifact(
        LLAMA if request.param == "llama" else HYBRID,
        tmp_path_factory.mktemp("cuda") / f"{request.param}.ninfer",
        seed=8,
        tokenizer="synthetic",
    )


def _engine(path: Path, **options) -> object:
    opts = {
        "max_concurrency": 2,
        "max_context": 512,
        "prefill_chunk": 128,
        "kv_capacity": 4096,
        "device_sampling": False,  # host sampling: the events carry the logits
    } | options
    table = [bytes([65 + i % 26]) for i in range(VOCAB)]
    return _core.Engine.open(
        str(path), _core.EngineOptions(**opts), table, eos_ids=[0], device="cuda"
    )


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _logits(outcome) -> np.ndarray:
    return np.stack([e.logits for e in outcome.events if e.token_ids])


def test_hit_matches_a_cold_prefill(artifact: Path) -> None:
    prompt = _prompt(1, 200)
    cold_engine = _engine(artifact, prefix_reuse=False)
    cold = run_one(cold_engine, prompt, 8, **GREEDY)
    cold_engine.shutdown()
    engine = _engine(artifact)
    first = run_one(engine, prompt, 8, **GREEDY)
    hit = run_one(engine, prompt, 8, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert hit.final.cached_tokens == 192
    want, got = _logits(cold), _logits(hit)
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 0.03 * scale + 1e-3
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    assert hit.tokens == first.tokens == cold.tokens
    assert stats["cache_problem"] == "" and stats["kv_pages_free"] == stats["kv_pages_total"]


def test_pause_and_replay_finish_every_request_once(artifact: Path) -> None:
    # bf16 rounding depends on the batch's shape, so greedy tokens may differ from a run alone
    # at a near tie; what must hold is that every request ends with exactly its tokens, once.
    prompts = [_prompt(10 + i, 60 + 11 * i) for i in range(3)]
    engine = _engine(
        artifact, max_concurrency=3, kv_capacity=320, max_context=320, prefill_chunk=64
    )
    ids = [engine.submit(p, 70, temperature=0.0, ignore_eos=True).request_id for p in prompts]
    got = collect(engine, ids, timeout=120)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert stats["pauses"] > 0
    for i in ids:
        assert got[i].final.finish_reason == "length"
        assert len(got[i].tokens) == got[i].final.completion_tokens == 70
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
    assert stats["cache_problem"] == ""


def test_cache_file_round_trip_on_the_device(artifact: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "cache.bin")
    prompt = _prompt(20, 200)
    first = _engine(artifact)
    cold = run_one(first, prompt, 6, **GREEDY)
    first.shutdown()
    assert first.save_prefix_cache(path)["ok"]
    del first
    second = _engine(artifact)
    report = second.load_prefix_cache(path)
    assert report["ok"] and report["blocks"] == 3, report
    hit = run_one(second, prompt, 6, **GREEDY)
    second.shutdown()
    assert hit.final.cached_tokens == 192
    assert hit.tokens == cold.tokens
    want = _logits(cold)
    assert np.abs(_logits(hit) - want).max() <= 0.03 * float(np.abs(want).max()) + 1e-3


def test_host_tier_hit_matches_a_cold_prefill(artifact: Path) -> None:
    # A 512-token device pool: the 450-token prompt pushes the first one off the device, its
    # blocks (and, on the hybrid, its state snapshot) go to the host tier and come back.
    prompt, other = _prompt(30, 150), _prompt(31, 450)
    cold_engine = _engine(artifact, prefix_reuse=False)
    cold = run_one(cold_engine, prompt, 6, **GREEDY)
    cold_engine.shutdown()
    engine = _engine(
        artifact, max_concurrency=1, kv_capacity=512, max_context=512, host_context_bytes=64 << 20
    )
    run_one(engine, prompt, 6, **GREEDY)
    run_one(engine, other, 6, temperature=0.0, ignore_eos=True)
    hit = run_one(engine, prompt, 6, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert hit.final.cached_tokens == 128
    assert stats["host_tier"]["block_restores"] >= 1
    want, got = _logits(cold), _logits(hit)
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 0.03 * scale + 1e-3
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    assert stats["cache_problem"] == "" and stats["kv_pages_free"] == stats["kv_pages_total"]
