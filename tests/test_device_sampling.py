"""Host side of sampling on the device (no GPU): the draw given to the Sampler, the flattened
per-row batch a device sampler receives, and the engine's device-sampling path run over the
ToyModel, whose "device" sampler is the host reference (_core.sample_rows_host)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ninfer import _core
from sampling_cases import random_row, with_draw
from toy_engine import VOCAB, collect, make_engine, submit_ok


@pytest.mark.parametrize("vocab", [7, 1000])
def test_host_reference_is_the_sampler_with_the_draw(vocab):
    rng = np.random.default_rng(vocab)
    rows = [random_row(rng, vocab) for _ in range(200)]
    logits = rng.normal(0, 2, (len(rows), vocab)).astype(np.float32)
    got = _core.sample_rows_host(logits, rows)
    assert got.tolist() == [with_draw(logits[i], row) for i, row in enumerate(rows)]


def test_seeded_sample_uses_the_next_draw():
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1, 500).astype(np.float32)
    kw = {"temperature": 0.9, "top_p": 0.8, "top_k": 40, "min_p": 0.01}
    drawing, twin = _core.Sampler(seed=77, **kw), _core.Sampler(seed=77, **kw)
    for _ in range(50):
        assert drawing.sample(logits) == twin.sample_with_draw(logits, {}, [], twin.next_draw())


def _first_crossing(weights: np.ndarray, order: np.ndarray, u: float) -> int:
    cumulative = np.cumsum(weights[order].astype(np.float64))
    return int(order[np.searchsorted(cumulative, u * cumulative[-1], side="right")])


def test_the_draw_scans_in_id_order_without_top_p_and_by_probability_with_it():
    # Weights 1, 1/2, 1/4 ... assigned to shuffled ids: the two orders differ everywhere.
    ids = np.random.default_rng(5).permutation(8)
    logits = np.empty(8, np.float32)
    logits[ids] = -np.arange(8, dtype=np.float32) * np.float32(np.log(2.0))
    weights = np.exp(logits.astype(np.float64) - logits.max())
    for u in np.linspace(0.01, 0.99, 25):
        u = float(u)
        for top_k in (0, 8):  # 8 = the whole vocabulary: no filter
            row = {"temperature": 1.0, "top_k": top_k, "uniform": u}
            assert with_draw(logits, row) == _first_crossing(weights, np.arange(8), u)
        row = {"temperature": 1.0, "top_k": 6, "uniform": u}
        kept = np.sort(ids[:6])  # the six heaviest, in id order
        assert with_draw(logits, row) == _first_crossing(weights, kept, u)
        row = {"temperature": 1.0, "top_p": 0.999, "uniform": u}
        assert with_draw(logits, row) == _first_crossing(weights, ids, u)


def test_a_large_kept_set_is_drawn_most_probable_first():
    # top_p keeps ~16k tokens, past the Sampler's sorted heads: the draw order stays defined.
    vocab = 20000
    ids = np.random.default_rng(9).permutation(vocab)
    logits = np.empty(vocab, np.float32)
    logits[ids] = -np.arange(vocab, dtype=np.float32) * np.float32(1e-4)  # ids[0] most probable
    cumulative = np.cumsum(np.exp(logits[ids].astype(np.float64) - logits.max()))
    kept = int(np.searchsorted(cumulative, 0.9 * cumulative[-1])) + 1
    assert kept > 10000
    rank = {int(token): k for k, token in enumerate(ids[:kept])}
    for u in np.random.default_rng(10).random(40):
        token = with_draw(logits, {"temperature": 1.0, "top_p": 0.9, "uniform": float(u)})
        k = rank[token]
        target = u * cumulative[kept - 1]
        below = cumulative[k - 1] if k else 0.0
        assert below - 1e-2 <= target <= cumulative[k] + 1e-2, (k, target, below, cumulative[k])


def test_error_codes_match_the_sampler_errors():
    rows = [
        {"temperature": 0.7, "uniform": 0.5},
        {"temperature": 0.0},
        {"temperature": 1.0, "suppressed": [0, 1, 2]},
    ]
    logits = np.zeros((3, 3), np.float32)
    logits[0, 1] = np.nan
    logits[1, :] = -np.inf
    assert _core.sample_rows_host(logits, rows).tolist() == [-1, -2, -2]
    with pytest.raises(RuntimeError, match="NaN"):
        _core.Sampler(temperature=0.7).sample(logits[0])
    with pytest.raises(RuntimeError, match="no token can be sampled"):
        _core.Sampler(temperature=1.0).sample(np.zeros(3, np.float32), {}, [0, 1, 2])


def test_batch_rows_are_checked():
    logits = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match="unknown sampling row field"):
        _core.sample_rows_host(logits, [{"temprature": 1.0}])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        _core.sample_rows_host(logits, [{"uniform": 1.0}])
    with pytest.raises(ValueError, match="one row per sampling row"):
        _core.sample_rows_host(np.zeros((2, 4), np.float32), [{}])


# --- the engine's device-sampling path (ToyModel) -------------------------------------------

REQUESTS = [
    {"temperature": 0.0},
    {"temperature": 0.8, "seed": 11},
    {"temperature": 1.0, "top_k": 2, "seed": 12},
    {"temperature": 1.2, "top_p": 0.7, "seed": 13},
    {"temperature": 1.0, "min_p": 0.2, "seed": 14},
    {"temperature": 0.9, "presence_penalty": 1.0, "frequency_penalty": 0.5, "seed": 15},
    {"temperature": 2.0, "presence_penalty": 3.0, "frequency_penalty": 1.5, "top_k": 5, "seed": 16},
    {"temperature": 1.0, "seed": 17, "stop_token_ids": list(range(3, VOCAB, 9)), "min_tokens": 20},
]


def _run(device: bool, lanes: int) -> list[tuple]:
    engine = make_engine(max_concurrency=lanes, eos_ids=[0, 1, 2, 5])
    engine.toy_sample_on_device(device)
    try:
        rng = random.Random(4)
        prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 40))] for _ in REQUESTS]
        pairs = zip(prompts, REQUESTS, strict=True)
        ids = [submit_ok(engine, prompt, 48, **kw) for prompt, kw in pairs]
        got = collect(engine, ids)
        return [(got[i].tokens, got[i].final.finish_reason, got[i].final.error) for i in ids]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("lanes", [1, 8])
def test_engine_device_path_picks_the_host_tokens(lanes):
    host, device = _run(False, lanes), _run(True, lanes)
    assert device == host
    assert sum(len(tokens) for tokens, _, _ in host) > 100


@pytest.mark.parametrize("poison", [float("nan"), float("-inf")])
@pytest.mark.parametrize("device", [False, True])
def test_engine_reports_the_same_sampling_error_on_both_paths(poison, device):
    engine = make_engine(max_concurrency=1)
    engine.toy_sample_on_device(device)
    try:
        engine.toy_poison_next_rows(1, poison)
        rid = submit_ok(engine, [3, 4, 5], 8, temperature=0.7, seed=1)
        final = collect(engine, [rid])[rid].final
        expected = "NaN logit" if np.isnan(poison) else "no token can be sampled"
        assert final.finish_reason == "error"
        assert final.error.startswith("sampling failed: ") and expected in final.error
        # The engine stays healthy: the next request is served.
        rid = submit_ok(engine, [3, 4, 5], 4, temperature=0.0)
        assert collect(engine, [rid])[rid].final.finish_reason == "length"
    finally:
        engine.shutdown()
