"""Qwen3.5/3.6 hybrid models (qwen3_5, qwen3_5_moe) against transformers, on small fp32 configs
with the real ratios (tests/qwen3_5_cases.py): full-sequence logits over more than two GDN
chunks, greedy continuations, chunked prefill = token-by-token decode, batched lanes = each
lane alone, and the state rules (no rewinding, reset).

The logits reference is the transformers model in float64. Random small models amplify fp32
rounding (the chunked delta rule with small heads is ill-conditioned), so the bound is relative
to transformers' own fp32 error against the same float64 reference.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ninfer import _core  # noqa: E402
from qwen3_5_cases import VOCAB, build_artifact  # noqa: E402

PROMPT = 150  # more than two 64-token chunks, with a partial third


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def case(request, tmp_path_factory):
    model, artifact = build_artifact(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, model, artifact


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, size=n).tolist()


def _runner(artifact: Path, lanes: int = 1, batch: int = 256) -> object:
    return _core.ModelRunner(str(artifact), max_lanes=lanes, max_batch_tokens=batch, threads=2,
                             max_context=512)


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].double().numpy()


def _decode_one_by_one(runner, lane: int, ids: list[int]) -> np.ndarray:
    return np.stack([runner.forward(lane, i, [t]) for i, t in enumerate(ids)])


def test_logits_match_transformers(case):
    name, model, artifact = case
    ids = _tokens(1, PROMPT)
    exact = _hf_logits(copy.deepcopy(model).double(), ids)
    hf_error = np.abs(_hf_logits(model, ids) - exact).max()
    ours = _runner(artifact).forward(0, 0, ids, all_logits=True)
    assert ours.shape == (PROMPT, VOCAB)
    scale = np.abs(exact).max()
    error = np.abs(ours - exact).max()
    bound = max(3.0 * hf_error, 2e-5 * scale)
    assert error <= bound, f"{name}: |ours - f64| {error:.3g} > {bound:.3g} (HF: {hf_error:.3g})"
    assert (ours.argmax(-1) == exact.argmax(-1)).all()


def test_greedy_continuation_matches_transformers(case):
    name, model, artifact = case
    prompt, steps = _tokens(2, PROMPT), 16
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                             min_new_tokens=steps)
    expected = out[0, len(prompt):].tolist()
    runner = _runner(artifact)
    logits = runner.forward(0, 0, prompt)  # chunked prefill, then recurrent decode
    got = []
    for i in range(steps):
        got.append(int(logits.argmax()))
        logits = runner.forward(0, len(prompt) + i, [got[-1]])
    assert got == expected, name


@pytest.fixture(scope="module")
def token_by_token(case):
    _, _, artifact = case
    ids = _tokens(3, PROMPT)
    return ids, _decode_one_by_one(_runner(artifact), 0, ids)


@pytest.mark.parametrize("chunk", [1, 63, 64, 65, 1024])
def test_chunked_prefill_equals_token_by_token_decode(case, token_by_token, chunk):
    name, _, artifact = case
    ids, reference = token_by_token
    runner = _runner(artifact, batch=min(chunk, 256))
    parts = [runner.forward(0, s, ids[s : s + chunk], all_logits=True)
             for s in range(0, len(ids), chunk)]
    got = np.concatenate(parts)
    error = np.abs(got - reference).max()
    assert error <= 2e-4 * np.abs(reference).max(), f"{name} chunk {chunk}: {error:.3g}"
    assert (got.argmax(-1) == reference.argmax(-1)).all()


def test_lanes_at_different_positions_batch_like_each_alone(case):
    name, _, artifact = case
    prompts = [_tokens(10 + i, n) for i, n in enumerate((70, 5, 130, 33))]
    alone = []
    for p in prompts:
        runner = _runner(artifact)
        rows = [runner.forward(0, 0, p[:-3], all_logits=True)]
        rows += [runner.forward(0, len(p) - 3 + j, [t])[None] for j, t in enumerate(p[-3:])]
        alone.append(np.concatenate(rows))
    runner = _runner(artifact, lanes=4)
    # Each lane prefills all but its last 3 tokens in one mixed step, then three decode steps.
    prefill = runner.forward_batch([(i, 0, p[:-3]) for i, p in enumerate(prompts)], all_logits=True)
    batched = [[] for _ in prompts]
    at = 0
    for i, p in enumerate(prompts):
        batched[i].append(prefill[at : at + len(p) - 3])
        at += len(p) - 3
    for j in range(3):
        step = runner.forward_batch([(i, len(p) - 3 + j, [p[len(p) - 3 + j]])
                                     for i, p in enumerate(prompts)])
        for i in range(len(prompts)):
            batched[i].append(step[i : i + 1])
    for i, ref in enumerate(alone):
        got = np.concatenate(batched[i])
        error = np.abs(got - ref).max()
        assert error <= 1e-5 * np.abs(ref).max(), f"{name} lane {i}: {error:.3g}"


def test_state_cannot_be_rewound_and_reset_restarts_the_lane(case):
    _, _, artifact = case
    ids = _tokens(4, 40)
    runner = _runner(artifact)
    first = runner.forward(0, 0, ids)
    with pytest.raises(ValueError, match="cannot be rewound"):
        runner.forward(0, 10, ids[10:])
    runner.reset(0)
    np.testing.assert_array_equal(runner.forward(0, 0, ids), first)
    with pytest.raises(ValueError, match="appears twice"):
        _runner(artifact).forward_batch([(0, 0, ids[:5]), (0, 0, ids[5:])])


def test_model_of_only_gdn_layers_matches_transformers(tmp_path):
    # No full-attention layer: the KV pool keeps one (unused) layer for the page bookkeeping.
    overrides = dict(num_hidden_layers=2, layer_types=["linear_attention"] * 2)
    model, artifact = build_artifact("qwen3_5", tmp_path, seed=3, overrides=overrides)
    ids = _tokens(6, 80)
    exact = _hf_logits(copy.deepcopy(model).double(), ids)
    hf_error = np.abs(_hf_logits(model, ids) - exact).max()
    runner = _runner(artifact)
    assert runner.info["num_kv_layers"] == 1
    ours = runner.forward(0, 0, ids, all_logits=True)
    assert np.abs(ours - exact).max() <= max(3.0 * hf_error, 2e-5 * np.abs(exact).max())
