"""The fused decode MoE MLP on the GPU (router + top-k, the selected experts' gate/up + SwiGLU,
down + routing-weighted sum + the sigmoid-gated shared expert; launchers_moe_decode.h) over
bf16, FP8 and NVFP4 weights in their stored format:

- each launch sequence against float64 on the dequantized weights, outputs poisoned (NaN);
- the separate ops with quantized expert stacks (the expert GEMV reading them quantized, the
  grouped and host paths on bf16 copies) against the same reference;
- a tiny random MoE hybrid in fp8 and nvfp4 on the GPU against the CPU backend on the same
  artifact, with CUDA graphs and eagerly, and graph replays against eager steps.

GPU machine only.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.artifact.block_quant import (
    dequantize_fp8,
    dequantize_nvfp4,
    quantize_fp8,
    quantize_nvfp4,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def ops():
    return _core.CudaMoeDecode(0)


def stored(values: np.ndarray, dtype: str):
    """(bytes, dtype, shape) as the artifact stores `values`, and the values it decodes to."""
    shape = list(values.shape)
    if dtype == "bf16":
        bits = f32_to_bf16_bits(values.astype(np.float32))
        decoded = bf16_bits_to_f32(bits).astype(np.float64)
        return (np.ascontiguousarray(bits), "bf16", shape), decoded
    blob = (quantize_fp8 if dtype == "fp8" else quantize_nvfp4)(values)
    decoded = (dequantize_fp8 if dtype == "fp8" else dequantize_nvfp4)(blob, shape)
    return (blob, dtype, shape), decoded.astype(np.float64)


def silu(v):
    return v / (1.0 + np.exp(-v))


def reference(x, w, top_k, renormalize=True):
    """float64 MoE MLP on the decoded weights; also the smallest gap between the k-th and the
    (k+1)-th routing probability over the tokens (a near tie could route either way)."""
    x = x.astype(np.float64)
    logits = x @ w["router"].T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    order = np.argsort(-p, axis=1, kind="stable")
    ff = w["down"].shape[2]
    out = np.zeros_like(x)
    gap = np.inf
    for t in range(x.shape[0]):
        chosen = order[t, :top_k]
        gap = min(gap, p[t, order[t, top_k - 1]] - p[t, order[t, top_k]])
        weights = p[t, chosen] / (p[t, chosen].sum() if renormalize else 1.0)
        for e, wt in zip(chosen, weights, strict=True):
            gu = w["gate_up"][e] @ x[t]
            out[t] += wt * (w["down"][e] @ (silu(gu[:ff]) * gu[ff:]))
        shared = w["shared_down"] @ (silu(w["gate"] @ x[t]) * (w["up"] @ x[t]))
        out[t] += shared / (1.0 + np.exp(-(w["shared_gate"] @ x[t])[0]))
    return out, gap


@functools.lru_cache(maxsize=16)
def make_mlp(dtype, hidden, experts, ff, shared_ff, seed):
    """Stored weights and their decoded float64 values (shared by the tests of one shape)."""
    rng = np.random.default_rng(seed)

    def uniform(*shape, scale):
        return rng.uniform(-scale, scale, size=shape).astype(np.float32)

    raw = {
        "router": (uniform(experts, hidden, scale=0.2), "bf16"),
        "gate_up": (uniform(experts, 2 * ff, hidden, scale=0.1), dtype),
        "down": (uniform(experts, hidden, ff, scale=0.1), dtype),
        "shared_gate": (uniform(1, hidden, scale=0.1), "bf16"),
        "gate": (uniform(shared_ff, hidden, scale=0.1), dtype),
        "up": (uniform(shared_ff, hidden, scale=0.1), dtype),
        "shared_down": (uniform(hidden, shared_ff, scale=0.1), dtype),
    }
    specs, decoded = {}, {}
    for name, (values, fmt) in raw.items():
        specs[name], decoded[name] = stored(values, fmt)
    return specs, decoded


def routable_input(decoded, tokens, hidden, top_k, seed):
    """x whose routing has no near tie at the k-th expert (so float32 and float64 agree)."""
    rng = np.random.default_rng(seed)
    for _ in range(50):
        x = rng.standard_normal((tokens, hidden)).astype(np.float32)
        want, gap = reference(x, decoded, top_k)
        if gap > 1e-4:
            return x, want
    raise AssertionError("no input without a routing near-tie")


def run(ops, specs, x, top_k, fused=True, path="auto"):
    out = np.full(x.shape, np.nan, dtype=np.float32)
    ran = ops.moe_mlp(
        x,
        specs["router"],
        specs["gate_up"],
        specs["down"],
        specs["shared_gate"],
        specs["gate"],
        specs["up"],
        specs["shared_down"],
        top_k,
        True,
        out,
        fused=fused,
        path=path,
    )
    return ran, out


# hidden, experts, ff, shared_ff, top_k: the experts' PER_LANE 1 / 2 / 4 / 8 (35B-A3B's 256
# experts: 33 routing blocks a token, the last one scoring only the shared gate) / 16 routing;
# ff 96 and shared_ff 160 leave whole gate/up blocks (16 rows) idle for the routed experts.
SHAPES = [
    (256, 16, 64, 96, 4),
    (256, 64, 64, 64, 8),
    (256, 128, 32, 128, 8),
    (512, 256, 96, 160, 8),
    (256, 512, 32, 64, 8),  # 16 tokens x 8 = 128 pairs, the fused path's limit
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-e{}-ff{}-s{}-k{}".format(*s))
@pytest.mark.parametrize("tokens", [1, 3, 16])
@pytest.mark.parametrize("dtype", ["bf16", "fp8", "nvfp4"])
def test_fused_moe_mlp_matches_float64(ops, dtype, tokens, shape):
    hidden, experts, ff, shared_ff, top_k = shape
    specs, decoded = make_mlp(dtype, hidden, experts, ff, shared_ff, seed=experts)
    x, want = routable_input(decoded, tokens, hidden, top_k, seed=7 * tokens)
    ran, got = run(ops, specs, x, top_k)
    assert ran, "the fused path declined a supported shape"
    assert np.isfinite(got).all(), "an output was not written (NaN poison) or is not finite"
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= 2e-5 * scale + 1e-6, f"{dtype}: |fused - float64| {err:.3g} (scale {scale:.3g})"


def test_fused_moe_mlp_repeats_bit_for_bit(ops):
    specs, decoded = make_mlp("nvfp4", 256, 16, 64, 96, seed=5)
    x, _ = routable_input(decoded, 4, 256, 4, seed=9)
    first = run(ops, specs, x, 4)[1]
    for _ in range(3):
        np.testing.assert_array_equal(run(ops, specs, x, 4)[1], first)


def test_fused_moe_mlp_declines_prefill_sized_batches(ops):
    """Past 128 (token, slot) pairs, or with a forced grouped path, the fused call does nothing
    (the model runs the separate ops) and writes nothing."""
    specs, decoded = make_mlp("fp8", 256, 16, 64, 96, seed=3)
    x, _ = routable_input(decoded, 40, 256, 4, seed=2)  # 160 pairs
    ran, got = run(ops, specs, x, 4)
    assert not ran and np.isnan(got).all()
    ran, got = run(ops, specs, x[:2], 4, path="grouped")
    assert not ran and np.isnan(got).all()


@pytest.mark.parametrize("path", ["gemv", "grouped", "host"])
@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_quantized_experts_through_the_separate_ops(ops, dtype, path):
    """moe_experts with quantized stacks: the GEMV path reads them quantized, grouped and host
    run bf16 copies made on the device."""
    hidden, experts, ff, shared_ff, top_k = SHAPES[0]
    specs, decoded = make_mlp(dtype, hidden, experts, ff, shared_ff, seed=11)
    x, want = routable_input(decoded, 6, hidden, top_k, seed=4)
    ran, got = run(ops, specs, x, top_k, fused=False, path=path)
    assert ran and np.isfinite(got).all()
    scale = float(np.abs(want).max())
    # the shared expert's GEMVs (and grouped/host's expert GEMMs) round x to bf16
    assert np.abs(got - want).max() <= 1.5e-2 * scale + 1e-6, path


MOE_CONFIG = {
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "vocab_size": 512,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 96,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
}


def _decode(runner, ids, steps):
    got = [runner.forward(0, 0, ids, all_logits=True)]
    got += [runner.forward(0, len(ids) + i, [t]) for i, t in enumerate(steps)]
    return got


def _gpu_against_cpu(path, tmp_path, monkeypatch):
    """Prefill and decode of an artifact on the GPU, with graphs and eagerly, against the CPU
    backend: no further from it than the GPU on the artifact's decoded values (bf16 twin);
    graph replays equal eager steps bit for bit."""
    from artifact_twins import f32_twin
    from test_cuda_quant_gemv import DECODE

    twin = f32_twin(path, tmp_path / "twin.ninfer")
    ids = np.random.default_rng(3).integers(0, 512, size=40).tolist()
    cpu = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2)
    want = _decode(cpu, ids, DECODE)
    scale = float(np.abs(want[0]).max())
    results = {}
    monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")  # no timed GEMV/cuBLAS choice between runs
    # W8A16 prefill, like the bf16 twin's; the W8A8 one (the default for FP8 weights) against
    # the CPU: tests/test_cuda_fp8_gemm.py
    monkeypatch.setenv("NINFER_FP8_GEMM", "0")
    for mode in ("graphs", "eager"):
        monkeypatch.setenv("NINFER_CUDA_GRAPHS", "1" if mode == "graphs" else "0")
        for name, p in (("model", path), ("bf16 twin", twin)):
            runner = _core.ModelRunner(str(p), max_lanes=1, max_batch_tokens=64, device="cuda")
            replays = _core.cuda_graph_replays()
            got = _decode(runner, ids, DECODE)
            replays = _core.cuda_graph_replays() - replays
            assert (replays >= 2) if mode == "graphs" else (replays == 0), (mode, name, replays)
            assert all(np.isfinite(g).all() for g in got)
            results[mode, name] = got
            del runner
    errors = {
        key: [float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True)]
        for key, got in results.items()
    }
    print(f"{path.name}: |GPU - CPU| per step", errors)
    for mode in ("graphs", "eager"):
        for step, (q, t) in enumerate(
            zip(errors[mode, "model"], errors[mode, "bf16 twin"], strict=True)
        ):
            assert q <= 1.5 * t + 2e-3 * scale, f"{mode} step {step}: {q:.3g} vs twin {t:.3g}"
    for g, e in zip(results["graphs", "model"], results["eager", "model"], strict=True):
        assert np.array_equal(g, e), f"graph replay differs from eager: {np.abs(g - e).max():.3g}"


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4", "bf16"])
def test_quantized_moe_hybrid_on_the_gpu_matches_the_cpu(dtype, tmp_path, monkeypatch):
    """Prefill (grouped GEMMs on bf16 copies of the stacks) and decode (the fused kernels over
    the stored format) of a random MoE hybrid."""
    from ninfer.artifact import read_header
    from ninfer.convert.random import make_random_artifact

    path = make_random_artifact(
        MOE_CONFIG, tmp_path / "q.ninfer", dtype=dtype, tokenizer="synthetic"
    )
    experts = read_header(path).tensors["model.layers.0.mlp.experts.gate_up_proj"]
    assert experts["dtype"] == dtype
    _gpu_against_cpu(path, tmp_path, monkeypatch)


def test_modelopt_mixed_moe_hybrid_on_the_gpu_matches_the_cpu(tmp_path, monkeypatch):
    """NVFP4 experts with FP8 per-tensor attention, GDN and shared expert, converted from
    ModelOpt's release layout (tests/test_modelopt_moe_mixed.py)."""
    pytest.importorskip("transformers")
    from ninfer.convert import convert_source
    from test_modelopt_moe_mixed import modelopt_mixed_moe_release

    folder, _ = modelopt_mixed_moe_release(tmp_path / "hf")
    path = convert_source(folder, tmp_path / "mixed.ninfer", progress=False)
    _gpu_against_cpu(path, tmp_path, monkeypatch)
