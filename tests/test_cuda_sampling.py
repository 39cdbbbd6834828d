"""Sampling on the CUDA device against the host Sampler given the same draw (GPU machine only).

The kernel must pick what _core.sample_rows_host picks (the engine's Sampler with the row's
draw): exactly for greedy rows, top_k = 1, errors and draws far from a probability-mass
boundary; on random rows it may differ only where the host's expf and the device's weights
differ in their last bit or the sums' order moves a boundary, so the agreement rate must be
near 1. End to end, an engine on a random CUDA model gives the same seeded tokens with device
sampling as with host sampling.
"""

from __future__ import annotations

import select
import time

import numpy as np
import pytest

from ninfer import _core
from sampling_cases import random_row

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

QWEN_VOCAB = 248320


@pytest.fixture(scope="module")
def sampler():
    return _core.CudaSampler(0)


@pytest.fixture(scope="module")
def samplers():
    """Every cluster size: rows split over 1, 2, 4 or 8 blocks (slices may be empty)."""
    return {blocks: _core.CudaSampler(0, cluster_blocks=blocks) for blocks in (1, 2, 4, 8)}


def _compare(sampler, logits: np.ndarray, rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    host = _core.sample_rows_host(logits, rows)
    device = sampler.sample_rows(logits, rows)
    valid = (device >= 0) & (device < logits.shape[1]) | (device == -1) | (device == -2)
    assert valid.all(), f"unwritten or out-of-range ids: {device[~valid][:8]}"
    return host, device


def _report(host, device, rows) -> str:
    bad = np.flatnonzero(host != device)[:5]
    return "; ".join(f"row {i}: host {host[i]} device {device[i]} {rows[i]}" for i in bad)


@pytest.mark.parametrize("blocks", [1, 2, 4, 8])
@pytest.mark.parametrize("vocab,count", [(7, 600), (1000, 600), (QWEN_VOCAB, 48)])
def test_random_rows_agree_with_the_host(samplers, blocks, vocab, count):
    sampler = samplers[blocks]
    rng = np.random.default_rng(vocab)
    rows = [random_row(rng, vocab) for _ in range(count)]
    scale = rng.choice([0.5, 2.0, 6.0], size=(count, 1))
    logits = (rng.normal(0, 1, (count, vocab)) * scale).astype(np.float32)
    host, device = _compare(sampler, logits, rows)
    agree = float(np.mean(host == device))
    print(f"vocab {vocab}: {agree:.4f} of {count} rows agree")
    assert agree >= 0.99, _report(host, device, rows)
    exact = np.array([r["temperature"] == 0.0 or r["top_k"] == 1 for r in rows])
    assert np.array_equal(host[exact], device[exact]), _report(host, device, rows)


@pytest.mark.parametrize("blocks", [1, 8])
@pytest.mark.parametrize("vocab", [7, 1000, QWEN_VOCAB])
def test_ties_go_to_the_lower_id(samplers, blocks, vocab):
    sampler = samplers[blocks]
    # Four distinct logits: most tokens tie with thousands of others.
    rng = np.random.default_rng(vocab + 1)
    count = 64 if vocab == QWEN_VOCAB else 400
    rows = [random_row(rng, vocab) for _ in range(count)]
    logits = rng.integers(0, 4, (count, vocab)).astype(np.float32)
    host, device = _compare(sampler, logits, rows)
    assert float(np.mean(host == device)) >= 0.99, _report(host, device, rows)
    exact = np.array([r["temperature"] == 0.0 or r["top_k"] == 1 for r in rows])
    assert np.array_equal(host[exact], device[exact]), _report(host, device, rows)


def _draw_edges(heads: np.ndarray, ids: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Cumulative-mass boundaries (fractions of the kept mass) of a row whose only weighty tokens
    are `heads` (weights, most probable first) at `ids`; the rest weigh nothing that matters."""
    keep = heads.size if top_k in (0, 50) else top_k
    w, where = heads[:keep], ids[:keep]
    if top_p < 1.0:
        w = w[: int(np.searchsorted(np.cumsum(w), top_p * w.sum())) + 1]
    else:
        w = w[np.argsort(where)]  # the draw scans in id order
    return np.concatenate([[0.0], np.cumsum(w)]) / w.sum()


@pytest.mark.parametrize("blocks", [1, 8])
@pytest.mark.parametrize("vocab", [1000, QWEN_VOCAB])
def test_well_separated_rows_agree_exactly(samplers, blocks, vocab):
    sampler = samplers[blocks]
    rng = np.random.default_rng(11)
    count = 64
    logits = np.full((count, vocab), -30.0, np.float32)
    heads = np.array([4.0, 3.0, 2.0, 1.0, 0.0], np.float32)
    weights = np.exp(heads.astype(np.float64) - 4.0)
    rows = []
    for i in range(count):
        ids = rng.choice(vocab, size=heads.size, replace=False)
        logits[i, ids] = heads
        row = {
            "temperature": 1.0,
            "top_k": int(rng.choice([0, 3, 50])),
            "top_p": float(rng.choice([1.0, 0.99])),
            "min_p": float(rng.choice([0.0, 1e-9])),
        }
        edges = _draw_edges(weights, ids, row["top_k"], row["top_p"])
        u = rng.random()
        while np.min(np.abs(edges - u)) < 1e-4:
            u = rng.random()
        rows.append(row | {"uniform": float(u)})
    host, device = _compare(sampler, logits, rows)
    assert np.array_equal(host, device), _report(host, device, rows)


@pytest.mark.parametrize("blocks", [1, 4])
def test_errors_become_codes(samplers, blocks):
    sampler = samplers[blocks]
    vocab = 1000
    logits = np.random.default_rng(2).normal(0, 1, (6, vocab)).astype(np.float32)
    logits[0, 500] = np.nan
    logits[1, :] = -np.inf
    logits[2, 3] = np.inf
    logits[3, 7] = np.nan
    logits[3, 8] = np.inf  # a NaN wins over an infinity, as on the host
    rows = [
        {"temperature": 0.7, "uniform": 0.3},
        {"temperature": 0.0},
        {"temperature": 1.0, "uniform": 0.1},
        {"temperature": 0.0},
        {"temperature": 1.0, "suppressed": list(range(vocab)), "uniform": 0.2},
        {"temperature": 1.0, "top_k": 5, "suppressed": list(range(vocab - 1)), "uniform": 0.9},
    ]
    host, device = _compare(sampler, logits, rows)
    assert device.tolist() == [-1, -2, -2, -1, -2, vocab - 1]
    assert np.array_equal(host, device)


@pytest.mark.parametrize("blocks", [1, 2])
def test_penalties_and_suppression(samplers, blocks):
    sampler = samplers[blocks]
    vocab = 50
    rng = np.random.default_rng(8)
    logits = np.tile(rng.normal(0, 1, vocab).astype(np.float32), (200, 1))
    rows = []
    for _ in range(200):
        penalised = rng.choice(vocab, 20, replace=False)
        rows.append({
            "temperature": float(rng.choice([0.0, 1.0])),
            "uniform": float(rng.random()),
            "presence_penalty": float(rng.normal(0, 2)),
            "frequency_penalty": float(rng.normal(0, 1)),
            "penalties": {int(t): int(rng.integers(1, 9)) for t in penalised},
            "suppressed": [int(t) for t in rng.choice(vocab, 10)],
        })
    host, device = _compare(sampler, logits, rows)
    assert np.array_equal(host, device), _report(host, device, rows)
    for row, token in zip(rows, device, strict=True):
        assert token not in row["suppressed"]


def test_draws_follow_the_distribution(sampler):
    """Uniform draws over one row reproduce its filtered softmax (a check of the kernel alone)."""
    vocab, count = 30, 4000
    base = np.random.default_rng(4).normal(0, 1.5, vocab).astype(np.float32)
    logits = np.tile(base, (count, 1))
    u = (np.arange(count) + 0.5) / count
    rows = [{"temperature": 0.8, "top_k": 12, "top_p": 0.9, "uniform": float(x)} for x in u]
    device = sampler.sample_rows(logits, rows)
    p = np.exp((base.astype(np.float64) - base.max()) / 0.8)
    order = np.lexsort((np.arange(vocab), -p))
    keep = order[:12]
    mass = np.cumsum(p[keep]) / p[keep].sum()
    keep = keep[: int(np.searchsorted(mass, 0.9)) + 1]
    expected = np.zeros(vocab)
    expected[keep] = p[keep] / p[keep].sum()
    freq = np.bincount(device, minlength=vocab) / count
    assert set(np.flatnonzero(freq)) <= set(keep.tolist())
    assert np.abs(freq - expected).max() < 2.0 / count + 1e-9


# --- end to end: an engine on a random CUDA model ------------------------------------------

E2E_VOCAB = 400
DENSE = dict(
    hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, vocab_size=E2E_VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_position_embeddings=4096, tie_word_embeddings=False,
    architectures=["LlamaForCausalLM"], model_type="llama",
)
HYBRID = dict(
    hidden_size=128, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=64, linear_value_head_dim=32, vocab_size=E2E_VOCAB, mtp_num_hidden_layers=0,
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text",
)
REQUESTS = [
    {"temperature": 0.0},
    {"temperature": 1.0, "seed": 1},
    {"temperature": 0.7, "top_p": 0.9, "seed": 2},
    {"temperature": 1.0, "top_k": 20, "top_p": 0.95, "seed": 3},
    {"temperature": 1.3, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.3,
     "seed": 4},
    {"temperature": 0.9, "top_k": 3, "seed": 5, "stop_token_ids": [7, 8, 9], "min_tokens": 30},
]


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def artifact(request, tmp_path_factory):
    from ninfer.convert.random import make_random_artifact

    config = DENSE if request.param == "llama" else HYBRID
    return make_random_artifact(config, tmp_path_factory.mktemp(request.param) / "m.ninfer", seed=9,
                                tokenizer="synthetic")


def _run_alone(engine, prompt: list[int], kw: dict) -> list[int]:
    result = engine.submit(prompt, 40, **kw)
    assert result.accepted, result
    tokens: list[int] = []
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the request did not finish"
        select.select([engine.event_fd], [], [], 0.5)
        for ev in engine.drain_events():
            if ev.request_id != result.request_id or ev.kind == "admitted":
                continue
            assert ev.error is None, ev.error
            tokens += ev.token_ids
            if ev.finished:
                return tokens


def _generate(path, device_sampling: bool) -> list[list[int]]:
    """Each request alone (a batch's make-up depends on timing, and it moves logits by rounding)."""
    options = _core.EngineOptions(max_concurrency=2, max_context=512, prefill_chunk=64,
                                  device_sampling=device_sampling)
    token_bytes = [bytes([65 + i % 26]) for i in range(E2E_VOCAB)]
    engine = _core.Engine.open(str(path), options, token_bytes, eos_ids=[0], device="cuda")
    assert engine.samples_on_device == device_sampling
    try:
        rng = np.random.default_rng(6)
        prompts = [rng.integers(0, E2E_VOCAB, int(rng.integers(5, 90))).tolist() for _ in REQUESTS]
        pairs = zip(prompts, REQUESTS, strict=True)
        return [_run_alone(engine, prompt, kw) for prompt, kw in pairs]
    finally:
        engine.shutdown()


def test_engine_device_sampling_matches_host_sampling(artifact, monkeypatch):
    monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")  # both engines compute the same logits
    host = _generate(artifact, False)
    device = _generate(artifact, True)
    assert sum(map(len, host)) > 100
    assert device == host


def test_model_steps_sample_what_the_host_would(artifact, monkeypatch):
    """Two runners on one artifact run the same batched steps; one returns logits (sampled here
    by the host reference), the other samples on the device: the ids must match."""
    monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")
    lanes = 3
    runners = [
        _core.ModelRunner(str(artifact), max_lanes=lanes, max_batch_tokens=256, max_context=512,
                          device="cuda")
        for _ in range(2)
    ]
    rng = np.random.default_rng(12)
    prompts = [rng.integers(0, E2E_VOCAB, 20 + 7 * lane).tolist() for lane in range(lanes)]
    for runner in runners:
        runner.forward_batch([(lane, 0, ids) for lane, ids in enumerate(prompts)])
    pos = [len(ids) for ids in prompts]
    last = [ids[-1] for ids in prompts]
    agree = 0
    for _ in range(24):
        step = [(lane, pos[lane], [last[lane]]) for lane in range(lanes)]
        rows = [random_row(rng, E2E_VOCAB) for _ in range(lanes)]
        host = _core.sample_rows_host(runners[0].forward_batch(step), rows)
        device = runners[1].forward_batch_sampled(step, rows)
        agree += int(np.sum(host == device))
        assert np.all(host >= 0)
        pos = [p + 1 for p in pos]
        last = host.tolist()  # both runners continue from the same tokens
    assert agree >= 24 * lanes - 1, f"{agree} of {24 * lanes} rows agree"


def _mask_words(allowed: np.ndarray, vocab: int) -> list[int]:
    bits = np.zeros(((vocab + 31) // 32) * 32, dtype=np.uint8)
    bits[allowed] = 1
    return np.packbits(bits, bitorder="little").view(np.uint32).tolist()


@pytest.mark.parametrize("vocab", [1000, QWEN_VOCAB])
def test_masked_rows_agree_with_the_host(sampler, vocab):
    """Grammar bitmasks: the device sampler never picks a masked token and picks what the host
    reference picks (greedy and sampled rows; one row allows nothing)."""
    rng = np.random.default_rng(vocab + 1)
    rows, allowed_sets = [], []
    for i in range(24):
        allowed = rng.choice(vocab, size=int(rng.integers(1, 40)), replace=False)
        row = random_row(rng, vocab)
        row["bitmask"] = _mask_words(allowed if i else np.array([], dtype=int), vocab)
        rows.append(row)
        allowed_sets.append(set(allowed.tolist()) if i else set())
    logits = rng.standard_normal((len(rows), vocab)).astype(np.float32) * 4
    host, device = _compare(sampler, logits, rows)
    assert device[0] == -2 and host[0] == -2  # nothing selectable
    for i in range(1, len(rows)):
        assert host[i] in allowed_sets[i]
    assert np.sum(host == device) >= len(rows) - 1, _report(host, device, rows)


def _generate_constrained(path, device_sampling: bool) -> list[list[int]]:
    options = _core.EngineOptions(max_concurrency=2, max_context=512, prefill_chunk=64,
                                  device_sampling=device_sampling)  # fmt: skip
    token_bytes = [bytes([65 + i % 26]) for i in range(E2E_VOCAB)]
    engine = _core.Engine.open(str(path), options, token_bytes, eos_ids=[0], device="cuda")
    try:
        grammar = engine.compile_grammar("regex", "[B-F]{3,12}")
        rng = np.random.default_rng(8)
        outputs = []
        for kw in REQUESTS[:3]:
            prompt = rng.integers(1, E2E_VOCAB, 30).tolist()
            tokens = _run_alone(engine, prompt, {**kw, "constraint": grammar})
            text = b"".join(token_bytes[t] for t in tokens if t != 0).decode()
            assert 3 <= len(text) <= 12 and set(text) <= set("BCDEF"), text
            outputs.append(tokens)
        return outputs
    finally:
        engine.shutdown()


def test_engine_constrained_decode_device_matches_host(artifact, monkeypatch):
    """The mask applied inside the device sampler gives the host-sampled tokens, token for token."""
    monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")
    assert _generate_constrained(artifact, True) == _generate_constrained(artifact, False)
