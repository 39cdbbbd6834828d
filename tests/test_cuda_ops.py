"""Every CUDA backend op against a float64 reference on fresh random inputs.

Outputs are poisoned (NaN) before each op, so an element the op fails to write fails the
test. bf16 operands (weights, the KV cache, GEMM inputs) are compared at bf16 tolerances
against a reference that sees the same bf16-rounded operands where the kernel rounds them.
Runs only where a CUDA device exists (tools/gpu/check.sh on the GPU machine).
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


@pytest.fixture(scope="module")
def ops():
    return _core.CudaOps(0)


def rng_for(*key: int) -> np.random.Generator:
    return np.random.default_rng([20261129, *key])


def poisoned(shape) -> np.ndarray:
    return np.full(shape, np.nan, dtype=np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32)))


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    assert np.all(np.isfinite(ours)), "output has unwritten (NaN) or non-finite elements"
    return float(np.linalg.norm(ours.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.mark.parametrize("path", ["gemv", "cublas", "auto"])
@pytest.mark.parametrize(
    "m,n,k", [(1, 96, 64), (3, 200, 136), (8, 1024, 512), (16, 64, 2048), (37, 300, 256)])
def test_matmul_bf16(ops, path, m, n, k):
    if path == "cublas" and not ops.cublas_available:
        pytest.skip("cuBLAS not loadable")
    rng = rng_for(m, n, k)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    w_bits = f32_to_bf16_bits(w)
    out = poisoned((m, n))
    ops.matmul_many(x, [w_bits], "bf16", [out], [bias], path)
    # Both paths round x to bf16 and accumulate in f32: only summation order differs.
    ref = bf16_round(x).astype(np.float64) @ bf16_bits_to_f32(w_bits).astype(np.float64).T + bias
    assert rel_err(out, ref) < 2e-5


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_matmul_many_converts_weights_to_bf16(ops, dtype):
    rng = rng_for(7, len(dtype))
    m, k = 4, 256
    x = rng.standard_normal((m, k), dtype=np.float32)
    ws = [rng.standard_normal((n, k), dtype=np.float32) for n in (128, 32, 32)]
    if dtype == "f32":
        raw = ws
    elif dtype == "f16":
        raw = [w.astype(np.float16).view(np.uint16) for w in ws]
        ws = [w.astype(np.float16).astype(np.float32) for w in ws]
    else:
        from ninfer.artifact import dequantize_q8_0, quantize_q8_0

        raw = [quantize_q8_0(w) for w in ws]
        ws = [dequantize_q8_0(r, w.shape) for r, w in zip(raw, ws, strict=True)]
    outs = [poisoned((m, w.shape[0])) for w in ws]
    ops.matmul_many(x, raw, dtype, outs, [None, None, None], "auto")
    for out, w in zip(outs, ws, strict=True):
        ref = bf16_round(x).astype(np.float64) @ bf16_round(w).astype(np.float64).T
        assert rel_err(out, ref) < 2e-5


def test_embedding_and_random_weight(ops):
    rng = rng_for(11)
    table = rng.standard_normal((300, 136), dtype=np.float32)
    tokens = rng.integers(0, 300, size=9).astype(np.int32)
    out = poisoned((9, 136))
    ops.embedding(f32_to_bf16_bits(table), "bf16", tokens, out)
    np.testing.assert_array_equal(out, bf16_round(table)[tokens])
    with pytest.raises(IndexError, match="vocabulary"):
        bad = np.array([300], np.int32)
        ops.embedding(f32_to_bf16_bits(table), "bf16", bad, poisoned((1, 136)))
    a = ops.random_weight(64, 96, 5, 0.5)
    b = ops.random_weight(64, 96, 5, 0.5)
    c = ops.random_weight(64, 96, 6, 0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.abs(a).max() <= 0.5 and abs(float(a.mean())) < 0.02 and 0.25 < float(a.std()) < 0.33


@pytest.mark.parametrize("cols", [256, 1000, 5120, 17000])
def test_rms_norm(ops, cols):
    rng = rng_for(12, cols)
    x = rng.standard_normal((7, cols), dtype=np.float32) * 3
    w = rng.standard_normal(cols, dtype=np.float32)
    out = poisoned(x.shape)
    ops.rms_norm(x, w, 1e-5, out)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-5) * w
    assert rel_err(out, ref) < 1e-5


# A warp a row for 128/256/512 (in place, as the models call it, and not), the block-a-row
# rms_norm for other widths.
@pytest.mark.parametrize("head_dim", [128, 256, 512, 64, 200])
@pytest.mark.parametrize("in_place", [True, False])
def test_head_rms_norm(ops, head_dim, in_place):
    rng = rng_for(14, head_dim)
    x = rng.standard_normal((7 * 24 + 3, head_dim), dtype=np.float32) * 3
    w = rng.standard_normal(head_dim, dtype=np.float32)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * w
    out = x.copy() if in_place else poisoned(x.shape)
    ops.head_rms_norm(out if in_place else x, w, 1e-6, out)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_rope_matches_rotate_half(ops, rotary_dim):
    rng = rng_for(13, rotary_dim)
    tokens, heads, hd = 5, 3, 128
    x = rng.standard_normal((tokens, heads, hd), dtype=np.float32)
    positions = rng.integers(0, 30000, size=tokens).astype(np.int32)
    inv_freq = (1.0 / (10000.0 ** (np.arange(0, rotary_dim, 2) / rotary_dim))).astype(np.float32)
    y = x.copy()
    ops.rope(y, positions, inv_freq, 1.25)
    half = rotary_dim // 2
    angle = (positions[:, None].astype(np.float32) * inv_freq[None, :]).astype(np.float64)
    cos, sin = np.cos(angle)[:, None, :] * 1.25, np.sin(angle)[:, None, :] * 1.25
    x64 = x.astype(np.float64)
    ref = x64.copy()
    a, b = x64[..., :half], x64[..., half:rotary_dim]
    ref[..., :half] = a * cos - b * sin
    ref[..., half:rotary_dim] = b * cos + a * sin
    assert rel_err(y, ref) < 1e-5


def test_swiglu_add_gather(ops):
    rng = rng_for(14)
    g = rng.standard_normal(5000, dtype=np.float32) * 4
    u = rng.standard_normal(5000, dtype=np.float32)
    out = poisoned(5000)
    ops.swiglu(g, u, out)
    g64 = g.astype(np.float64)
    assert rel_err(out, g64 / (1 + np.exp(-g64)) * u) < 1e-6
    y = rng.standard_normal(5000, dtype=np.float32)
    x = rng.standard_normal(5000, dtype=np.float32)
    ref = y.astype(np.float64) + x
    ops.add(y, x)
    assert rel_err(y, ref) < 1e-7
    src = rng.standard_normal((10, 33), dtype=np.float32)
    rows = np.array([9, 0, 4, 4], np.int32)
    dst = poisoned((4, 33))
    ops.gather_rows(src, rows, dst)
    np.testing.assert_array_equal(dst, src[rows])


def reference_attention(q, keys, values, slices, scale):
    """float64 causal GQA attention over bf16-rounded K/V."""
    out, row = [], 0
    nh, nkv = q.shape[1], keys[0].shape[1]
    group = nh // nkv
    for (start, count, _), k, v in zip(slices, keys, values, strict=True):
        k64, v64 = bf16_round(k).astype(np.float64), bf16_round(v).astype(np.float64)
        for i in range(count):
            last = start + i
            rows = []
            for h in range(nh):
                s = k64[: last + 1, h // group] @ q[row + i, h].astype(np.float64) * scale
                p = np.exp(s - s.max())
                rows.append(p @ v64[: last + 1, h // group] / p.sum())
            out.append(rows)
        row += count
    return np.array(out)


def attention_case(seed, hd, nh, nkv, spans, pool_pages=64):
    rng = rng_for(seed, hd)
    free = list(rng.permutation(pool_pages).astype(np.int32))  # scattered, out-of-order pages
    q_rows, keys, values, slices = [], [], [], []
    for start, count in spans:
        total = start + count
        pages = [int(free.pop()) for _ in range((total + 63) // 64)]
        keys.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        values.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        q_rows.append(rng.standard_normal((count, nh, hd), dtype=np.float32))
        slices.append((start, count, pages))
    return np.concatenate(q_rows), keys, values, slices


@pytest.mark.parametrize(
    "hd,nh,nkv", [(64, 4, 4), (128, 8, 2), (256, 24, 4), (128, 12, 1), (64, 6, 3)])
@pytest.mark.parametrize(
    "path,splits", [("decode", 1), ("decode", 3), ("decode", 0), ("prefill", 0), ("auto", 0)])
def test_paged_attention(ops, hd, nh, nkv, path, splits):
    # Decode rows deep in the cache, a chunk continuing a cached prefix, and a fresh prompt
    # that is not a multiple of the 64-row block.
    spans = [(300, 1), (130, 70), (0, 100), (37, 1)]
    q, keys, values, slices = attention_case(hd + nh, hd, nh, nkv, spans)
    scale = 1.0 / np.sqrt(hd)
    out = poisoned(q.shape)
    ops.paged_attention(q, keys, values, slices, 64, scale, out, path, splits)
    ref = reference_attention(q, keys, values, slices, scale)
    # The prefill kernel also rounds q and the probabilities to bf16 for the tensor cores.
    tol = 2e-5 if path == "decode" else 1.5e-2
    assert rel_err(out, ref) < tol


def test_attention_rejects_bad_slices(ops):
    q, keys, values, slices = attention_case(3, 64, 2, 2, [(10, 5)])
    bad = [(10, 5, [70])]  # page id outside the pool
    with pytest.raises(IndexError, match="outside the KV pool"):
        ops.paged_attention(q, keys, values, bad, 64, 0.125, poisoned(q.shape), "auto", 0)
    with pytest.raises(ValueError, match="head_dim"):
        q2, k2, v2, s2 = attention_case(4, 64, 2, 2, [(0, 3)])
        ops.paged_attention(q2[..., :48].copy(), [k[..., :48].copy() for k in k2],
                            [v[..., :48].copy() for v in v2], s2, 64, 0.1, poisoned((3, 2, 48)),
                            "auto", 0)


# Widths for every register-cached block shape (1..16 values a thread) and the looping one.
@pytest.mark.parametrize("cols", [64, 256, 300, 1000, 5120, 12000, 17000])
def test_add_rms_norm_equals_add_then_rms_norm(ops, cols):
    rng = rng_for(31, cols)
    h = rng.standard_normal((5, cols), dtype=np.float32) * 2
    branch = rng.standard_normal((5, cols), dtype=np.float32)
    w = rng.standard_normal(cols, dtype=np.float32)
    fused_h, fused_out = h.copy(), poisoned(h.shape)
    ops.add_rms_norm(fused_h, branch, w, 1e-6, fused_out)
    np.testing.assert_array_equal(fused_h, h + branch)
    plain_out = poisoned(h.shape)
    ops.rms_norm(h + branch, w, 1e-6, plain_out)
    np.testing.assert_array_equal(fused_out, plain_out)  # same operations in the same order
    s64 = h.astype(np.float64) + branch
    ref = s64 / np.sqrt((s64**2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert rel_err(fused_out, ref) < 1e-5
