"""The CUDA MoE experts (`CudaOps.moe_experts`) on each path against a float64 reference.

Paths: "grouped" (device-built plan, grouped tensor-core GEMMs with fused SwiGLU), "gemv" (per
(token, slot) GEMV, decode) and "host" (host-grouped cuBLAS matmuls). All round the GEMM inputs
(x and the SwiGLU rows) to bf16 and accumulate in fp32; the reference rounds them the same way,
so only summation order and the rare rounding-boundary flip differ.

Routing: random router logits make near-ties in the top-k choice possible in principle; most
tests therefore use a fixed routing (logits with wide gaps between the chosen experts and the
rest) so that they test the grouping and the GEMMs alone. Fresh random inputs per test (the
seed is in every failure message). Runs only where a CUDA device exists.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import bf16_bits_to_f32, f32_to_bf16_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

# (hidden, ff, experts, top_k): column and k tails in both GEMMs (ff 96 = 64 + 32, hidden 160 =
# 128 + 32; k steps of 64); 256 experts as in Qwen3.6-35B-A3B; the 35B-A3B expert widths with
# fewer experts; widths that are multiples of 8 only.
SMALL = (160, 96, 16, 4)
ODD = (72, 40, 8, 2)
MANY = (256, 64, 256, 8)
WIDE = (2048, 512, 16, 8)


@pytest.fixture(scope="module")
def ops():
    return _core.CudaOps(0)


@pytest.fixture
def seed():
    return secrets.randbits(31)


@pytest.fixture(scope="module")
def wide_experts():
    """Experts of the WIDE shape, fresh per module run (making them takes a second)."""
    seed = secrets.randbits(31)
    return (seed, *make_experts(np.random.default_rng(seed), WIDE[0], WIDE[1], WIDE[2]))


def bf16_round(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32))).astype(np.float64)


def make_experts(rng, hidden, ff, experts):
    gate_up = rng.standard_normal((experts * 2 * ff, hidden), dtype=np.float32) / np.sqrt(hidden)
    down = rng.standard_normal((experts * hidden, ff), dtype=np.float32) / np.sqrt(ff)
    return f32_to_bf16_bits(gate_up.astype(np.float32)), f32_to_bf16_bits(down.astype(np.float32))


def fixed_logits(rng, ids: np.ndarray, experts: int) -> np.ndarray:
    """Router logits whose top-k is exactly `ids` (in order), with wide gaps to the rest."""
    tokens, top_k = ids.shape
    logits = rng.uniform(-4.0, -2.0, size=(tokens, experts))
    logits[np.arange(tokens)[:, None], ids] = 8.0 - 0.5 * np.arange(top_k)
    return logits.astype(np.float32)


def distinct_choices(rng, tokens: int, top_k: int, pool: np.ndarray) -> np.ndarray:
    rows = [rng.choice(pool, size=top_k, replace=False) for _ in range(tokens)]
    return np.stack(rows).astype(np.int32)


def reference(x, logits, gate_up, down, top_k, renormalize):
    """float64 MoE over the bf16 operands the kernels see; ids as the fp64 softmax ranks them."""
    tokens, hidden = x.shape
    ff = down.shape[1]
    l64 = logits.astype(np.float64)
    p = np.exp(l64 - l64.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, ids, axis=1)
    if renormalize:
        w /= w.sum(axis=1, keepdims=True)
    xb = bf16_round(x)
    out = np.zeros((tokens, hidden))
    for e in np.unique(ids):
        t, s = np.nonzero(ids == e)
        gu = bf16_bits_to_f32(gate_up[e * 2 * ff:(e + 1) * 2 * ff]).astype(np.float64)
        h = xb[t] @ gu.T
        act = bf16_round(h[:, :ff] / (1.0 + np.exp(-h[:, :ff])) * h[:, ff:])
        y = act @ bf16_bits_to_f32(down[e * hidden:(e + 1) * hidden]).astype(np.float64).T
        np.add.at(out, t, w[t, s, None] * y)
    return out


def run(ops, x, logits, gate_up, down, top_k, path, tile_rows=0, renormalize=True, tile_cols=0):
    out = np.full(x.shape, np.nan, np.float32)
    ops.moe_experts(x, logits, gate_up, down, top_k, renormalize, out, path, tile_rows, tile_cols)
    return out


def check(ours, ref, seed, what, tol=2e-3):
    assert np.all(np.isfinite(ours)), f"{what} (seed {seed}): non-finite elements"
    err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    rows = np.linalg.norm(ours - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
    worst = int(rows.argmax())
    assert err < tol and rows[worst] < 10 * tol, (
        f"{what} (seed {seed}): relative error {err:.3g}, worst token {worst} at {rows[worst]:.3g}"
    )


@pytest.mark.parametrize("tokens", [1, 7, 64, 300, 2048])
@pytest.mark.parametrize("shape", [SMALL, MANY, ODD], ids=["small", "256experts", "odd"])
def test_grouped_fixed_routing(ops, seed, tokens, shape):
    hidden, ff, experts, top_k = shape
    rng = np.random.default_rng(seed)
    gate_up, down = make_experts(rng, hidden, ff, experts)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    logits = fixed_logits(rng, distinct_choices(rng, tokens, top_k, np.arange(experts)), experts)
    ref = reference(x, logits, gate_up, down, top_k, True)
    out = run(ops, x, logits, gate_up, down, top_k, "grouped")
    check(out, ref, seed, f"grouped {shape} x {tokens}")


@pytest.mark.parametrize("tile_rows,tile_cols", [(32, 0), (64, 0), (128, 0), (128, 256)])
@pytest.mark.parametrize("tokens", [7, 300])
def test_grouped_wide_experts(ops, seed, wide_experts, tokens, tile_rows, tile_cols):
    """The 35B-A3B expert widths (hidden 2048, ff 512, top-8) on every tile shape."""
    hidden, ff, experts, top_k = WIDE
    rng = np.random.default_rng(seed)
    weight_seed, gate_up, down = wide_experts
    seed = (weight_seed, seed)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    logits = fixed_logits(rng, distinct_choices(rng, tokens, top_k, np.arange(experts)), experts)
    ref = reference(x, logits, gate_up, down, top_k, True)
    out = run(ops, x, logits, gate_up, down, top_k, "grouped", tile_rows, tile_cols=tile_cols)
    check(out, ref, seed, f"grouped wide x {tokens}, {tile_rows}x{tile_cols or 128} tiles")


@pytest.mark.parametrize("tile_rows,tile_cols", [(32, 0), (128, 0), (128, 256)])
def test_grouped_experts_without_rows_and_one_crowded_expert(ops, seed, tile_rows, tile_cols):
    """Odd experts get no rows; expert 6 gets every token (a group of many tiles)."""
    hidden, ff, experts, top_k = MANY
    tokens = 700
    rng = np.random.default_rng(seed)
    gate_up, down = make_experts(rng, hidden, ff, experts)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    even = np.arange(0, experts, 2)
    ids = distinct_choices(rng, tokens, top_k, even[even != 6])
    ids[:, rng.integers(top_k)] = 6  # expert 6 in a random slot of every token
    logits = fixed_logits(rng, ids, experts)
    ref = reference(x, logits, gate_up, down, top_k, False)
    out = run(ops, x, logits, gate_up, down, top_k, "grouped", tile_rows, False, tile_cols)
    check(out, ref, seed, f"grouped, empty and crowded experts, {tile_rows}-row tiles")


@pytest.mark.parametrize("experts,top_k", [(64, 6), (512, 10)])
def test_grouped_random_router(ops, seed, experts, top_k):
    """Routing on the device from random logits (fp32 softmax, ties to the lower id)."""
    hidden, ff, tokens = 128, 64, 257
    rng = np.random.default_rng(seed)
    gate_up, down = make_experts(rng, hidden, ff, experts)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    logits = (rng.standard_normal((tokens, experts)) * 2).astype(np.float32)
    ref = reference(x, logits, gate_up, down, top_k, True)
    out = run(ops, x, logits, gate_up, down, top_k, "grouped")
    check(out, ref, seed, f"grouped, random router, {experts} experts")


@pytest.mark.parametrize("tokens", [1, 16, 64])
def test_paths_agree(ops, seed, tokens):
    """grouped, gemv and host compute the same math; auto picks one of them."""
    hidden, ff, experts, top_k = MANY
    rng = np.random.default_rng(seed)
    gate_up, down = make_experts(rng, hidden, ff, experts)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    logits = fixed_logits(rng, distinct_choices(rng, tokens, top_k, np.arange(experts)), experts)
    ref = reference(x, logits, gate_up, down, top_k, True)
    for path in ("grouped", "gemv", "host", "auto"):
        check(run(ops, x, logits, gate_up, down, top_k, path), ref, seed, f"{path} x {tokens}")


def test_grouped_is_deterministic(ops, seed, wide_experts):
    hidden, ff, experts, top_k = WIDE
    tokens = 300
    rng = np.random.default_rng(seed)
    _, gate_up, down = wide_experts
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    logits = (rng.standard_normal((tokens, experts)) * 2).astype(np.float32)
    first = run(ops, x, logits, gate_up, down, top_k, "grouped")
    for _ in range(2):
        again = run(ops, x, logits, gate_up, down, top_k, "grouped")
        assert np.array_equal(first, again), f"seed {seed}: a second run gave different bits"


def test_grouped_rejects_unsupported_shapes(ops):
    rng = np.random.default_rng(0)
    hidden, ff, experts = 100, 64, 4  # hidden not a multiple of 8
    gate_up, down = make_experts(rng, hidden, ff, experts)
    tokens = 100  # 200 (token, slot) pairs: beyond the GEMV path's batches
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    logits = fixed_logits(rng, distinct_choices(rng, tokens, 2, np.arange(experts)), experts)
    with pytest.raises(ValueError, match="% 8"):
        run(ops, x, logits, gate_up, down, 2, "grouped")
    ref = reference(x, logits, gate_up, down, 2, True)
    check(run(ops, x, logits, gate_up, down, 2, "auto"), ref, 0, "auto falls back for hidden 100")
