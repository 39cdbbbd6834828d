"""CPU ops against float64 numpy references, on both the AVX2 and the portable kernel paths.

Every output array is filled with NaN before the op, so an element the op fails to write
shows up as a mismatch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import bf16_bits_to_f32, dequantize_q8_0, f32_to_bf16_bits, quantize_q8_0


def _available_kernels() -> list[str]:
    names = ["scalar"]
    for name in ("avx2", "avxvnni", "avx512vnni"):
        try:
            _core.set_cpu_kernels(name)
            names.append(name)
        except RuntimeError:  # not supported by this CPU
            pass
    _core.set_cpu_kernels("auto")
    return names


@pytest.fixture(params=_available_kernels())
def kernels(request):
    _core.set_cpu_kernels(request.param)
    assert _core.cpu_kernels() == request.param
    yield request.param
    _core.set_cpu_kernels("auto")


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


def poisoned(*shape: int) -> np.ndarray:
    return np.full(shape, np.nan, dtype=np.float32)


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# --- matmul ---------------------------------------------------------------------------------


def _encode(w: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(stored weight array, its exact float64 value) for a weight dtype."""
    if dtype == "f32":
        return w, w.astype(np.float64)
    if dtype == "f16":
        half = w.astype(np.float16)
        return half.view(np.uint16), half.astype(np.float64)
    if dtype == "bf16":
        bits = f32_to_bf16_bits(w)
        return bits, bf16_bits_to_f32(bits).astype(np.float64)
    raw = quantize_q8_0(w)
    return raw, dequantize_q8_0(raw, w.shape).astype(np.float64)


MATMUL_SHAPES = [
    (1, 1, 1),
    (1, 7, 33),
    (2, 5, 8),
    (3, 9, 100),
    (5, 130, 64),
    (67, 13, 250),
    (1, 300, 576),
]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("m,n,k", MATMUL_SHAPES)
@pytest.mark.parametrize("threads", [1, 3])
def test_matmul_float_weights(kernels, rng, dtype, m, n, k, threads):
    x, w = randn(rng, m, k), randn(rng, n, k)
    bias = randn(rng, n) if n % 2 else None
    stored, exact = _encode(w, dtype)
    out = poisoned(m, n)
    _core.matmul(x, stored, dtype, out, bias=bias, threads=threads)
    ref = x.astype(np.float64) @ exact.T + (0 if bias is None else bias)
    # Float32 summation error bound: a few ulps per term of sum |x||w|.
    bound = 2.5e-7 * k * (np.abs(x) @ np.abs(exact).T) + 1e-6
    assert np.all(np.abs(out - ref) <= bound), np.abs(out - ref).max()


def _quantize_rows_like_kernel(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Activation rows as the kernel quantizes them: per 32 values, scale max|x|/127."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=2)
    inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.rint(blocks * inv[..., None]).astype(np.int64)
    return q, (amax / np.float32(127.0)).astype(np.float64)


@pytest.mark.parametrize("m,n,k", [(1, 1, 32), (1, 7, 64), (2, 5, 96), (3, 33, 576), (70, 9, 1536)])
@pytest.mark.parametrize("threads", [1, 3])
def test_matmul_q8_0(kernels, rng, m, n, k, threads):
    x, w = randn(rng, m, k), randn(rng, n, k)
    x[0, :32] = 0.0  # an all-zero activation block must not divide by zero
    raw = quantize_q8_0(w)
    out = poisoned(m, n)
    _core.matmul(x, raw, "q8_0", out, threads=threads)

    # Exact model of the int8 path: integer block dots scaled by both block scales.
    blocks = raw.reshape(n, -1, 34)
    w_scale = blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float64)
    w_q = blocks[:, :, 2:].view(np.int8).astype(np.int64)
    x_q, x_scale = _quantize_rows_like_kernel(x)
    block_dots = np.einsum("mbl,nbl->mnb", x_q, w_q).astype(np.float64)
    terms = block_dots * x_scale[:, None, :] * w_scale[None, :, :]
    emulated = terms.sum(axis=2)
    assert np.all(np.abs(out - emulated) <= 1e-6 * np.abs(terms).sum(axis=2) + 1e-6)

    # Against the dequantized weights: activation rounding moves each x by <= scale/2.
    exact_w = dequantize_q8_0(raw, w.shape).astype(np.float64)
    ref = x.astype(np.float64) @ exact_w.T
    rounding = np.repeat(x_scale / 2, 32, axis=1) @ np.abs(exact_w).T
    assert np.all(np.abs(out - ref) <= rounding * 1.001 + 1e-5)


def test_matmul_rejects_mismatched_inputs():
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(TypeError, match="dtype"):
        _core.matmul(x, np.zeros((3, 64), np.float64), "f32", poisoned(2, 3))
    with pytest.raises(ValueError, match="shape"):
        _core.matmul(x, np.zeros((3, 63), np.float32), "f32", poisoned(2, 3))
    with pytest.raises(ValueError, match="shape"):
        _core.matmul(x, np.zeros((3, 64), np.float32), "f32", poisoned(2, 4))
    with pytest.raises(RuntimeError, match="unknown tensor dtype"):
        _core.matmul(x, np.zeros((3, 64), np.float32), "f8", poisoned(2, 3))


# --- embedding, norms, elementwise ----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
def test_embedding_rows(kernels, rng, dtype):
    vocab, cols = 50, 96
    stored, exact = _encode(randn(rng, vocab, cols), dtype)
    tokens = rng.integers(0, vocab, size=13).astype(np.int32)
    out = poisoned(len(tokens), cols)
    _core.embedding(stored, dtype, tokens, out)
    np.testing.assert_array_equal(out, exact[tokens].astype(np.float32))
    with pytest.raises(IndexError, match="vocabulary"):
        _core.embedding(stored, dtype, np.array([0, vocab], np.int32), poisoned(2, cols))


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (17, 64), (5, 577), (40, 16)])
def test_rms_norm(kernels, rng, rows, cols):
    x, weight = randn(rng, rows, cols) * 3, randn(rng, cols)
    eps = 1e-5
    out = poisoned(rows, cols)
    _core.rms_norm(x, weight, eps, out)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + eps) * weight
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=2e-6)
    _core.rms_norm(x, weight, eps, x)  # in place, as used for per-head q/k norms
    np.testing.assert_array_equal(x, out)


def _rope_reference(x, positions, inv_freq, factor):
    x = x.astype(np.float64).copy()
    half = len(inv_freq)
    angle = (positions.astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    cos, sin = np.cos(angle)[:, None, :] * factor, np.sin(angle)[:, None, :] * factor
    a, b = x[..., :half].copy(), x[..., half : 2 * half].copy()
    x[..., :half] = a * cos - b * sin
    x[..., half : 2 * half] = b * cos + a * sin
    return x


@pytest.mark.parametrize(
    "tokens,heads,head_dim,rotary_dim", [(1, 1, 2, 2), (5, 3, 64, 64), (9, 2, 32, 16)]
)
@pytest.mark.parametrize("factor", [1.0, 1.25])
def test_rope(kernels, rng, tokens, heads, head_dim, rotary_dim, factor):
    x = randn(rng, tokens, heads, head_dim)
    positions = rng.integers(0, 5000, size=tokens).astype(np.int32)
    inv_freq = (1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)).astype(np.float32)
    ref = _rope_reference(x, positions, inv_freq, factor)
    _core.rope(x, positions, inv_freq, factor)
    np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-5)


def test_swiglu_and_add(kernels, rng):
    n = 40_001  # above the threading threshold and not a multiple of any vector width
    gate, up = randn(rng, n) * 4, randn(rng, n)
    out = poisoned(n)
    _core.swiglu(gate, up, out)
    g = gate.astype(np.float64)
    np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * up, rtol=1e-5, atol=1e-6)
    y, x = randn(rng, n), randn(rng, n)
    expected = y.astype(np.float64) + x
    _core.add(y, x)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-7)


# --- RoPE frequencies against Hugging Face --------------------------------------------------

ROPE_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.5},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.8,
        "beta_fast": 16,
    },
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
@pytest.mark.parametrize("seq_len", [100, 5000])
def test_rope_inv_freq_matches_transformers(case, seq_len):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = ROPE_CASES[case]
    theta, head_dim, max_pos = 500000.0, 64, 2048
    hf_params = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
    config = transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=hf_params,
    )
    if hf_params["rope_type"] == "default":
        inv, factor = (
            transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(
                config
            )
        )
    else:
        inv, factor = ROPE_INIT_FUNCTIONS[hf_params["rope_type"]](config, "cpu", seq_len=seq_len)
    ours_config = {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "head_dim": head_dim,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": max_pos,
    }
    ours, ours_factor = _core.rope_inv_freq(json.dumps(ours_config), seq_len)
    np.testing.assert_allclose(ours, inv.numpy(), rtol=3e-7, atol=0)
    assert ours_factor == pytest.approx(factor, rel=1e-6)


def test_rope_inv_freq_rejects_unknown_type():
    config = {"num_attention_heads": 2, "head_dim": 8, "rope_scaling": {"rope_type": "spiral"}}
    with pytest.raises(RuntimeError, match="spiral"):
        _core.rope_inv_freq(json.dumps(config), 10)


# --- paged attention ------------------------------------------------------------------------


def _attention_reference(q, keys, start, scale):
    """Dense causal GQA attention for one slice: q [n, H, D], keys/values [start+n, KV, D]."""
    k, v = keys
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    out = np.empty(q.shape, np.float64)
    for i in range(n):
        visible = start + i + 1
        for h in range(heads):
            scores = k[:visible, h // group].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            p = np.exp(scores - scores.max())
            out[i, h] = p @ v[:visible, h // group].astype(np.float64) / p.sum()
    return out


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(1, 1, 8), (8, 2, 16), (4, 4, 64), (6, 1, 40)])
@pytest.mark.parametrize("threads", [1, 3])
def test_paged_attention_matches_dense(kernels, rng, heads, kv_heads, head_dim, threads):
    # Slices: a prefill chunk after cached context, single decode tokens, a fresh prefill
    # crossing a page boundary.
    layout = [(70, 5), (0, 1), (130, 1), (0, 67), (63, 2)]
    num_pages = 16
    free = rng.permutation(num_pages).tolist()  # scattered, non-monotonic page ids
    slices, keys, values, qs, refs = [], [], [], [], []
    scale = 1.0 / np.sqrt(head_dim)
    for start, count in layout:
        pages = [free.pop() for _ in range(-(-(start + count) // 64))]
        k = randn(rng, start + count, kv_heads, head_dim)
        v = randn(rng, start + count, kv_heads, head_dim)
        q = randn(rng, count, heads, head_dim) * 2
        slices.append((start, count, pages))
        keys.append(k)
        values.append(v)
        qs.append(q)
        refs.append(_attention_reference(q, (k, v), start, scale))
    q_all = np.ascontiguousarray(np.concatenate(qs))
    out = poisoned(*q_all.shape)
    _core.paged_attention(q_all, keys, values, slices, num_pages, scale, out, threads=threads)
    np.testing.assert_allclose(out, np.concatenate(refs), rtol=2e-5, atol=2e-5)


def test_paged_attention_rejects_short_page_table(rng):
    k = randn(rng, 65, 1, 8)
    with pytest.raises(ValueError, match="pages"):
        _core.paged_attention(
            randn(rng, 1, 1, 8), [k], [k], [(64, 1, [0])], 4, 1.0, poisoned(1, 1, 8)
        )


@pytest.mark.parametrize("threads", [3, 8])
@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (6, 2)])
def test_paged_attention_split_over_pages_matches_dense(kernels, rng, threads, heads, kv_heads):
    """Few long sequences: pages are split across threads and partial softmaxes merged."""
    head_dim, num_pages = 32, 24
    layout = [(300, 1), (130, 2), (0, 1)]  # long decode, short decode crossing a page, fresh
    free = rng.permutation(num_pages).tolist()
    slices, keys, values, qs, refs = [], [], [], [], []
    for start, count in layout:
        pages = [free.pop() for _ in range(-(-(start + count) // 64))]
        k = randn(rng, start + count, kv_heads, head_dim)
        v = randn(rng, start + count, kv_heads, head_dim)
        q = randn(rng, count, heads, head_dim) * 3
        slices.append((start, count, pages))
        keys.append(k)
        values.append(v)
        qs.append(q)
        refs.append(_attention_reference(q, (k, v), start, 0.2))
    q_all = np.ascontiguousarray(np.concatenate(qs))
    out = poisoned(*q_all.shape)
    _core.paged_attention(q_all, keys, values, slices, num_pages, 0.2, out, threads=threads)
    np.testing.assert_allclose(out, np.concatenate(refs), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        ((True, False, True), "avx512vnni"),  # AMD Zen 4: AVX-512 VNNI without VEX AVX-VNNI
        ((True, True, True), "avx512vnni"),  # Sapphire Rapids, Zen 5
        ((True, True, False), "avxvnni"),  # Alder Lake client cores
        ((True, False, False), "avx2"),
        ((False, True, True), "scalar"),
    ],
)
def test_auto_selects_the_best_set_the_cpu_has(features, expected):
    assert _core.best_cpu_kernels(*features) == expected


def test_auto_is_the_best_runnable_set_here():
    _core.set_cpu_kernels("auto")
    available = _available_kernels()
    best = next(n for n in ("avx512vnni", "avxvnni", "avx2", "scalar") if n in available)
    assert _core.cpu_kernels() == best
