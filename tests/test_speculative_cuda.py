"""Speculative rounds on the CUDA backend (marked `gpu`): a random Qwen3.5 hybrid with an MTP
head, device sampling and host sampling, one and three lanes. Greedy output with MTP drafting,
and with a draft oracle that injects rejections (rounds that accept several tokens and roll
the GDN state back), equals plain greedy output; a prefix-cache hit after a speculative turn
picks the cold prefill's tokens. bf16 verification (k + 1 positions in one slice) and a
single-token step round differently, so a divergence is accepted only at a near tie of the
plain run's logits (host sampling, where the logits are visible)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.convert.random import make_random_artifact
from toy_engine import collect, submit_ok

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device"),
]

GREEDY = {"temperature": 0.0, "ignore_eos": True}
HYBRID = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=128,
    intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
    linear_value_head_dim=32, vocab_size=400, mtp_num_hidden_layers=1,
)  # fmt: skip
VOCAB = 400
TIE = 0.05  # a top-2 logit gap under this may flip between bf16 summation orders


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return make_random_artifact(
        HYBRID, tmp_path_factory.mktemp("spec_cuda") / "h.ninfer", seed=8, tokenizer="synthetic"
    )


def _engine(path: Path, **options) -> object:
    opts = {"max_concurrency": 3, "max_context": 512, "prefill_chunk": 128, "kv_capacity": 4096}
    table = [bytes([65 + i % 26]) for i in range(VOCAB)]
    return _core.Engine.open(
        str(path), _core.EngineOptions(**(opts | options)), table, eos_ids=[0], device="cuda"
    )


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _run(engine, prompts, n, oracles=None, **kw):
    ids = []
    for i, p in enumerate(prompts):
        extra = {"draft_oracle": oracles[i]} if oracles else {}
        ids.append(submit_ok(engine, p, n, **GREEDY, **kw, **extra))
    got = collect(engine, ids, timeout=120)
    return [got[i] for i in ids]


def _same_up_to_ties(got: list[int], plain) -> None:
    """Equal tokens, or equal up to a first divergence where the plain logits tie."""
    want = plain.tokens
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a == b:
            continue
        rows = [e.logits for e in plain.events if e.token_ids]
        logits = (
            np.concatenate(rows).reshape(-1, VOCAB)[i] if rows and rows[0] is not None else None
        )
        assert logits is not None, f"divergence at {i} without logits to judge it"
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] < TIE, f"divergence at {i} without a tie: gap {top2[1] - top2[0]}"
        return


@pytest.mark.parametrize(
    ("spec", "device_sampling", "lanes"),
    [("mtp", True, 3), ("oracle", True, 1), ("oracle", False, 3), ("mtp", False, 1)],
)
def test_cuda_speculative_greedy_equals_plain(artifact, spec, device_sampling, lanes):
    prompts = [_prompt(10 + i, 70 + 23 * i) for i in range(lanes)]
    capture = {} if device_sampling else {"capture_logits": True}
    plain_engine = _engine(artifact, device_sampling=device_sampling)
    plain = _run(plain_engine, prompts, 48, **capture)
    plain_engine.shutdown()
    options = {"mtp_draft_tokens": 3} if spec == "mtp" else {"ngram_draft_tokens": 3}
    engine = _engine(artifact, device_sampling=device_sampling, **options)
    oracles = None
    if spec == "oracle":
        oracles = [
            [(t + 1) % VOCAB if j % 5 == 4 else t for j, t in enumerate(p.tokens)] for p in plain
        ]
    got = _run(engine, prompts, 48, oracles)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    for g, p in zip(got, plain, strict=True):
        if device_sampling:
            assert g.tokens == p.tokens
        else:
            _same_up_to_ties(g.tokens, p)
    assert stats["spec_rounds"] > 0
    if spec == "oracle":
        assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    assert stats["cache_problem"] == ""


def test_cuda_hit_after_a_speculative_turn_picks_the_cold_tokens(artifact):
    turn1 = _prompt(5, 101)
    cold_engine = _engine(artifact, prefix_reuse=False, device_sampling=False)
    (cold1,) = _run(cold_engine, [turn1], 60)
    turn2 = turn1 + cold1.tokens + _prompt(6, 20)
    (cold2,) = _run(cold_engine, [turn2], 16, capture_logits=True)
    cold_engine.shutdown()
    engine = _engine(artifact, ngram_draft_tokens=3, device_sampling=False)
    oracle = [(t + 1) % VOCAB if j % 7 == 6 else t for j, t in enumerate(cold1.tokens)]
    _run(engine, [turn1], 60, [oracle])
    (hit,) = _run(engine, [turn2], 16)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert hit.final.cached_tokens == 128  # the endpoint snapshot a round stepped over
    _same_up_to_ties(hit.tokens, cold2)
    assert stats["cache_problem"] == ""


@pytest.mark.parametrize(
    "options",
    [
        {"mtp_draft_tokens": 3},
        {"mtp_draft_tokens": 2, "lm_head_draft_tokens": 128},
        {"ngram_draft_tokens": 4},
    ],
)
def test_cuda_verification_and_draft_graphs_equal_eager(artifact, options, monkeypatch):
    """Verification rounds (k + 1 rows per lane, state history kept) and the MTP head's draft
    steps replay CUDA graphs; the same kernels run eagerly give the same tokens bit for bit,
    with rejections (oracle proposals wrong every fifth token) and three lanes."""
    prompts = [_prompt(40 + i, 50 + 17 * i) for i in range(3)]
    monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")  # no timed GEMV/cuBLAS choice may differ
    runs = []
    for graphs in ("0", "1"):
        monkeypatch.setenv("NINFER_CUDA_GRAPHS", graphs)
        engine = _engine(artifact, **options)
        oracles = None
        if "ngram_draft_tokens" in options:  # the oracle stands in for the copy drafter
            reference = _run(engine, prompts, 40)
            oracles = [
                [(t + 1) % VOCAB if j % 5 == 4 else t for j, t in enumerate(r.tokens)]
                for r in reference
            ]
        before = _core.cuda_graph_replays()
        got = _run(engine, prompts, 40, oracles)
        replays = _core.cuda_graph_replays() - before
        stats = engine.stats()
        engine.shutdown()
        assert stats["spec_rounds"] > 0
        runs.append(([g.tokens for g in got], replays, stats))
    (eager, eager_replays, _), (graphed, graph_replays, stats) = runs
    assert eager_replays == 0
    # Most rounds replay: the verification step, and with MTP the head's passes too.
    if "ngram_draft_tokens" in options:
        # copy proposals vary in length per lane, so rounds spread over many step shapes and
        # only the repeated ones replay
        assert graph_replays > 0, (graph_replays, stats["spec_rounds"])
    else:
        assert graph_replays >= stats["spec_rounds"] // 2, (graph_replays, stats["spec_rounds"])
    assert graphed == eager
