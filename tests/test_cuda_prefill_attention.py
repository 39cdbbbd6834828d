"""The CUDA prefill attention kernel against a float64 causal reference.

Covers head dims 64/128/256, GQA ratios 1/6/8, single- and double-buffered K/V, slices that
start mid-page, several slices of different lengths in one call, and poisoned (NaN) outputs.
The reference sees the same bf16-rounded q, K and V as the kernel, so what remains is the
kernel's bf16 rounding of the probabilities and f32 summation order. Rows are also checked
one by one: a masking slip changes a few rows a lot and the whole-array error hardly at all.
"""

from __future__ import annotations

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import bf16_bits_to_f32, f32_to_bf16_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

# (start, count): a fresh prompt longer than a block, a chunk continuing mid-page, a short
# chunk after a partial page, and a long chunk after several pages; none aligned to 64.
SPANS = [(0, 200), (100, 77), (37, 9), (513, 130)]
STAGES = [0, 1, 2]  # K/V buffers of the kernel; 0 = the default for the head dim


@pytest.fixture(scope="module")
def ops():
    return _core.CudaOps(0)


def bf16_round(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32)))


def make_case(seed: int, hd: int, nh: int, nkv: int, spans, pool_pages: int = 64):
    rng = np.random.default_rng([20261129, seed, hd, nh, nkv])
    free = list(rng.permutation(pool_pages).astype(np.int32))  # scattered, out-of-order pages
    q_rows, keys, values, slices = [], [], [], []
    for start, count in spans:
        total = start + count
        slices.append((start, count, [int(free.pop()) for _ in range((total + 63) // 64)]))
        keys.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        values.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        q_rows.append(rng.standard_normal((count, nh, hd), dtype=np.float32))
    return np.concatenate(q_rows), keys, values, slices


def reference(q, keys, values, slices, scale) -> np.ndarray:
    """float64 causal GQA attention over bf16-rounded q, K and V: [rows, heads, hd]."""
    nh, nkv = q.shape[1], keys[0].shape[1]
    group = nh // nkv
    out, row = [], 0
    for (start, count, _), k, v in zip(slices, keys, values, strict=True):
        qs = bf16_round(q[row : row + count]).astype(np.float64)
        k64, v64 = bf16_round(k).astype(np.float64), bf16_round(v).astype(np.float64)
        visible = np.arange(start + count)[None, :] <= (start + np.arange(count))[:, None]
        heads = []
        for h in range(nh):
            s = qs[:, h] @ k64[:, h // group].T * scale
            s = np.where(visible, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            heads.append(p @ v64[:, h // group] / p.sum(axis=1, keepdims=True))
        out.append(np.stack(heads, axis=1))
        row += count
    return np.concatenate(out)


def emulate_kernel(q, keys, values, slices, scale) -> np.ndarray:
    """The kernel's own arithmetic in float64: bf16 q, K and V; keys walked in 64-key pages
    with an online softmax in the log2 domain; probabilities rounded to bf16 for P·V but summed
    unrounded. What is left against the kernel is f32 accumulation and exp2 rounding."""
    nh, nkv = q.shape[1], keys[0].shape[1]
    group = nh // nkv
    out, row = [], 0
    for (start, count, _), k, v in zip(slices, keys, values, strict=True):
        qs = bf16_round(q[row : row + count]).astype(np.float64)
        k64, v64 = bf16_round(k).astype(np.float64), bf16_round(v).astype(np.float64)
        visible = np.arange(start + count)[None, :] <= (start + np.arange(count))[:, None]
        heads = []
        for h in range(nh):
            x = np.where(
                visible, qs[:, h] @ k64[:, h // group].T * (scale * np.log2(np.e)), -np.inf
            )
            m = np.full(count, -np.inf)
            total, acc = np.zeros(count), np.zeros((count, q.shape[2]))
            for first in range(0, start + count, 64):
                tile = x[:, first : first + 64]
                new_m = np.maximum(m, tile.max(axis=1))
                alpha = np.exp2(m - new_m)
                p = np.exp2(tile - new_m[:, None])
                total = total * alpha + p.sum(axis=1)
                acc = acc * alpha[:, None] + bf16_round(p) @ v64[first : first + 64, h // group]
                m = new_m
            heads.append(acc / total[:, None])
        out.append(np.stack(heads, axis=1))
        row += count
    return np.concatenate(out)


def check(out: np.ndarray, ref: np.ndarray, whole_tol: float, row_tol: float) -> None:
    bad = np.count_nonzero(~np.isfinite(out))
    assert bad == 0, f"{bad} unwritten (NaN) or non-finite elements"
    diff = out.astype(np.float64) - ref
    whole = np.linalg.norm(diff) / np.linalg.norm(ref)
    rows = np.linalg.norm(diff, axis=2) / np.maximum(np.linalg.norm(ref, axis=2), 1e-30)
    worst = np.unravel_index(np.argmax(rows), rows.shape)
    assert whole < whole_tol, f"relative error {whole:.3g}"
    assert rows.max() < row_tol, f"row {worst[0]} head {worst[1]}: relative error {rows.max():.3g}"


def run(ops, q, keys, values, slices, scale, stages) -> np.ndarray:
    out = np.full(q.shape, np.nan, dtype=np.float32)
    ops.paged_attention(q, keys, values, slices, 64, scale, out, "prefill", 0, stages)
    return out


@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("nh,nkv", [(4, 4), (24, 4), (16, 2)])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_prefill_attention_matches_reference(ops, hd, nh, nkv, stages):
    q, keys, values, slices = make_case(1, hd, nh, nkv, SPANS)
    scale = 1.0 / np.sqrt(hd)
    out = run(ops, q, keys, values, slices, scale, stages)
    # bf16 probabilities: ~2^-9 relative per weight, averaging out over the keys.
    check(out, reference(q, keys, values, slices, scale), 5e-3, 2e-2)


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_prefill_attention_is_its_bf16_arithmetic(ops, hd, stages):
    # Against an emulation of its own rounding the kernel must agree far more tightly than
    # against the exact reference: this pins down what it computes, not just roughly.
    q, keys, values, slices = make_case(4, hd, 8, 2, SPANS)
    q *= 2.0  # peakier rows: more rescaling and larger probability spreads
    scale = 1.0 / np.sqrt(hd)
    out = run(ops, q, keys, values, slices, scale, stages)
    check(out, emulate_kernel(q, keys, values, slices, scale), 3e-4, 1e-2)


@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("hd", [64, 256])
def test_prefill_attention_masks_exactly_the_future(ops, hd, stages):
    # Every query is the same sign vector u and key j is about (0.6 j) u in score units
    # (bf16 rounding keeps the scores nondecreasing in j), so a row's newest visible keys
    # carry most of its weight: letting in one future key, or dropping a visible one, moves
    # that row's output by O(1).
    nh, nkv = 8, 2
    q, keys, values, slices = make_case(2, hd, nh, nkv, SPANS)
    rng = np.random.default_rng([7, hd])
    scale = 1.0 / np.sqrt(hd)
    u = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(nkv, hd))
    q[:] = np.repeat(u, nh // nkv, axis=0)[None]
    for k in keys:
        steps = 0.6 * np.arange(k.shape[0], dtype=np.float32) / (hd * scale)
        k[:] = steps[:, None, None] * u[None]
    out = run(ops, q, keys, values, slices, scale, stages)
    check(out, reference(q, keys, values, slices, scale), 2e-2, 5e-2)


def test_prefill_attention_rejects_bad_stage_counts(ops):
    q, keys, values, slices = make_case(3, 64, 6, 2, [(0, 70)])
    out = np.full(q.shape, np.nan, dtype=np.float32)
    for stages in [3, -1]:
        with pytest.raises(ValueError, match="K/V stages"):
            ops.paged_attention(q, keys, values, slices, 64, 0.125, out, "prefill", 0, stages)
