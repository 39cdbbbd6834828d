"""The FP8 (W8A16) and NVFP4 (W4A16) CUDA kernels against float64 on fresh random inputs.

Weights are quantized by the converter's numpy code (the artifact layout); the reference is
float64 on the dequantized weights with x rounded to bf16 as the kernel does, so only the
summation order differs (a layout, nibble or scale bug is O(1)). Outputs are poisoned (NaN)
or random for the accumulating form; a guard past every output catches stray writes. Then the
dequantize-to-bf16 kernel (prefill, expert stacks) bit for bit, the device-made random
weights as valid tensors, and a whole quantized model on the GPU against the CPU backend on
the same artifact. GPU machine only.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from artifact_twins import f32_twin
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

RING_VARIANTS = (16, 17, 18, 19, 20, 21)
# the sector-shaped kernel (kernels_gemv_quant_sectors.cuh), one variant per tile shape
# (30-35: the double-buffered shapes)
SECTOR_VARIANTS = tuple(range(24, 36))
QUANTIZE = {"fp8": quantize_fp8, "nvfp4": quantize_nvfp4}
DEQUANTIZE = {"fp8": dequantize_fp8, "nvfp4": dequantize_nvfp4}


@pytest.fixture(scope="module")
def kernels():
    return _core.CudaQuantGemv(0)


def bf16_round(x):
    return bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32)))


def make_weight(rng, dtype, experts, rows, k, scale=0.05):
    w = (rng.standard_normal((experts, rows, k)) * scale).astype(np.float32)
    w[..., : min(k, 64)] *= 8  # uneven blocks: scales must differ between blocks
    blob = QUANTIZE[dtype](w)
    return blob, DEQUANTIZE[dtype](blob, w.shape).reshape(experts * rows, k)


@functools.lru_cache(maxsize=64)
def cached_weight(dtype, experts, rows, k, index):
    """make_weight of a seed of its own: quantizing in numpy is the slow part of these tests
    (seconds at k = 17408), so the cases that share a weight shape share the weight; x, bias
    and outputs stay fresh per case."""
    rng = np.random.default_rng([20261202, experts, rows, k, index, dtype == "nvfp4"])
    return make_weight(rng, dtype, experts, rows, k)


def run_case(kernels, dtype, m, k, shapes, *, accumulate=False, variant=0, slices=None):
    """shapes: per job (experts, rows per expert); slices: per job (first, count) or None."""
    rng = np.random.default_rng([20261201, m, k, len(shapes), variant, int(accumulate)])
    x = rng.standard_normal((m, k)).astype(np.float32)
    blobs, geometry, refs, biases, outs = [], [], [], [], []
    x64 = bf16_round(x).astype(np.float64)
    for j, (experts, rows) in enumerate(shapes):
        blob, dense = cached_weight(dtype, experts, rows, k, j)
        total = experts * rows
        first, count = slices[j] if slices else (0, total)
        bias = rng.standard_normal(count).astype(np.float32) if j % 2 == 0 else None
        ref = x64 @ dense[first : first + count].astype(np.float64).T
        magnitude = np.abs(x64) @ np.abs(dense[first : first + count]).astype(np.float64).T
        if bias is not None:
            ref = ref + bias
        out = (
            rng.standard_normal((m, count)).astype(np.float32)
            if accumulate
            else np.full((m, count), np.nan, dtype=np.float32)
        )
        if accumulate:
            ref = ref + out
        blobs.append(blob)
        geometry.append([total, rows, first, count])
        refs.append((ref, magnitude))
        biases.append(bias)
        outs.append(out)
    kernels.gemv(x, dtype, blobs, geometry, outs, biases, accumulate, variant)
    for out, (ref, magnitude) in zip(outs, refs, strict=True):
        assert np.isfinite(out).all()
        # f32 accumulation in another order: a few 2^-24 of sqrt(k)·Σ|x·w|
        tolerance = 4e-7 * np.sqrt(k) * magnitude.max() + 1e-6
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance)


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16])
@pytest.mark.parametrize("k", [5120, 17408, 2048, 96])
# 4, 8: the general kernel with software pipelining off, on; 0: the launcher's choice; 13:
# the staged kernel with 16-row tiles; 16-21: the ring kernel (8-, 16-, 32-row tiles; x
# converted per warp, or staged in shared memory); 24-29: the sector-shaped kernel
@pytest.mark.parametrize("variant", [0, 4, 8, 13, *RING_VARIANTS, *SECTOR_VARIANTS])
def test_gemv_matches_float64(kernels, dtype, m, k, variant):
    if dtype == "nvfp4" and k % 32:
        k = 128
    if not variant_applies(variant, dtype, m, k):
        pytest.skip("the variant does not take this m/k")
    run_case(kernels, dtype, m, k, [(1, 203)], variant=variant)


def staged_fits(m, k):
    """launchers_gemv_quant.cu's rule for the staged kernel: m <= 8, x as f16 in 44 KB."""
    return m <= 8 and m * (k + 8) * 2 <= 44 * 1024


def variant_applies(variant, dtype, m, k):
    """launchers_gemv_quant.cu's rules: the staged kernel as staged_fits; the ring kernel
    needs k % 256 == 0 for NVFP4, and its staged-x forms x as f16 beside 3 stages in the
    227 KB of shared memory a Hopper block may opt into."""
    if variant in (12, 13):
        return staged_fits(m, k)
    if variant in SECTOR_VARIANTS:
        return k % 128 == 0
    if variant in RING_VARIANTS:
        if dtype == "nvfp4" and k % 256:
            return False
        return variant % 2 == 0 or ring_stages_x(dtype, (variant - 16) // 2, m, k)
    return True


def ring_stages_x(dtype, rt, m, k):
    """kernels_gemv_quant_ring.cuh's RingShape and ring_slots: head + x + 3 stages fit."""
    nvfp4 = dtype == "nvfp4"
    tile_rows = 8 << rt
    stage_row = 1024 if tile_rows == 8 else 512
    stage = tile_rows * (stage_row + (64 if nvfp4 else 16) + (stage_row // 8 if nvfp4 else 0))
    head = 256 + 4 * (tile_rows // 8) * 4 * 32 * 4
    return head + m * (k + 8) * 2 + 3 * stage <= 227 * 1024


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
@pytest.mark.parametrize("variant", [12, 13, 16, 17, 19, 20, 24, 28, 30, 33])
def test_staged_kernel_with_large_activations_and_several_jobs(kernels, dtype, variant):
    # |x| beyond f16's range (65504) before the kernel's 2^-8, and tiny values that land on
    # f16's subnormal grid after it
    rng = np.random.default_rng(variant)
    m, k = 2, 1024
    x = rng.standard_normal((m, k)).astype(np.float32) * 32768
    x[:, ::7] *= 1e-9
    shapes = [(1, 96), (1, 40), (1, 8)]
    blobs, geometry, refs, outs = [], [], [], []
    x64 = bf16_round(x).astype(np.float64)
    for experts, rows in shapes:
        blob, dense = make_weight(rng, dtype, experts, rows, k)
        blobs.append(blob)
        geometry.append([rows, rows, 0, rows])
        refs.append(
            (x64 @ dense.astype(np.float64).T, np.abs(x64) @ np.abs(dense).astype(np.float64).T)
        )
        outs.append(np.full((m, rows), np.nan, dtype=np.float32))
    kernels.gemv(x, dtype, blobs, geometry, outs, [None] * len(shapes), False, variant)
    for out, (ref, magnitude) in zip(outs, refs, strict=True):
        tolerance = 4e-7 * np.sqrt(k) * magnitude.max() + 1e-6
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance)


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
@pytest.mark.parametrize(
    "variant", [1, 2, 3, 5, 6, 7, 9, 10, 11, 12, 13, *RING_VARIANTS, *SECTOR_VARIANTS]
)
def test_tile_variants_and_several_jobs(kernels, dtype, variant):
    run_case(kernels, dtype, 3, 5120, [(1, 384), (1, 37), (1, 1), (1, 130)], variant=variant)
    m = 8 if variant in (12, 13) else 12  # the staged kernel takes m <= 8
    run_case(kernels, dtype, m, 1024, [(1, 256), (1, 72)], variant=variant, accumulate=True)


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_expert_rows_of_a_stack(kernels, dtype):
    # rows of expert 2 of a stack of 4 (block scales restart at each 96-row expert), and a
    # slice that starts inside an expert and crosses into the next
    run_case(kernels, dtype, 4, 512, [(4, 96), (4, 96)], slices=[(192, 96), (150, 90)])
    run_case(kernels, dtype, 4, 512, [(4, 96), (4, 96)], slices=[(192, 96), (150, 90)], variant=12)
    for variant in (17, 18, *SECTOR_VARIANTS):
        run_case(
            kernels,
            dtype,
            4,
            512,
            [(4, 96), (4, 96)],
            slices=[(192, 96), (150, 90)],
            variant=variant,
        )


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_ring_kernel_picks_by_shape_and_env(kernels, dtype, monkeypatch):
    # variant 0 under NINFER_QUANT_GEMV_VARIANT / _TABLE takes the named variant where it
    # applies (the benchmark's per-shape winners) and its own choice elsewhere
    monkeypatch.setenv("NINFER_QUANT_GEMV_TABLE", f"{dtype}/2/1024/72=20,{dtype}/2/1024/9=4")
    run_case(kernels, dtype, 2, 1024, [(1, 72)])
    run_case(kernels, dtype, 2, 1024, [(1, 9)])
    monkeypatch.setenv("NINFER_QUANT_GEMV_VARIANT", "13")
    run_case(kernels, dtype, 12, 1024, [(1, 40)])  # 13 does not take m = 12: the default
    run_case(kernels, dtype, 3, 1024, [(1, 40)])
    monkeypatch.setenv("NINFER_QUANT_GEMV_VARIANT", "21")
    run_case(kernels, dtype, 16, 2048, [(1, 40), (1, 24)])


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_dequantize_kernel_matches_the_reference_bit_for_bit(kernels, dtype):
    rng = np.random.default_rng(5)
    blob, dense = make_weight(rng, dtype, 3, 136, 256)
    got = kernels.dequantize(dtype, blob, 3 * 136, 256, 136, 100, 250)
    want = f32_to_bf16_bits(dense[100:350])
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_device_random_weights_are_valid_tensors(kernels, dtype):
    blob = kernels.random(dtype, 256, 512, 256, 11, 0.1)
    values = DEQUANTIZE[dtype](blob, (256, 512))
    assert np.isfinite(values).all()
    assert np.abs(values).max() <= 0.1 * 1.0001
    assert 0.03 < values.std() < 0.07  # uniform(-0.1, 0.1): std 0.058
    other = kernels.random(dtype, 256, 512, 256, 12, 0.1)
    assert not np.array_equal(blob, other)


CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
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
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
}


DECODE = [5, 9, 17, 33, 65, 129]  # eager, captured, then replayed decode steps


@pytest.mark.parametrize("mode", ["graphs", "eager", "graphs-nopdl", "eager-nopdl"])
@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_quantized_model_on_the_gpu_matches_the_cpu(dtype, mode, tmp_path, monkeypatch):
    """Prefill (dequantize + cuBLAS) and decode (GEMV, as graphs or eagerly) of a quantized hybrid
    against the CPU reference on the same artifact: no further from it than the GPU's bf16
    path on the same (decoded) weights is, since both round activations to bf16."""
    from ninfer.convert.random import make_random_artifact

    monkeypatch.setenv("NINFER_CUDA_GRAPHS", "0" if mode.startswith("eager") else "1")
    monkeypatch.setenv("NINFER_CUDA_PDL", "0" if mode.endswith("nopdl") else "1")
    monkeypatch.setenv("NINFER_FP8_GEMM", "0")  # W8A16 prefill; the W8A8 one: test_cuda_fp8_gemm.py
    path = make_random_artifact(CONFIG, tmp_path / "q.ninfer", dtype=dtype, tokenizer="synthetic")
    twin = f32_twin(path, tmp_path / "twin.ninfer")
    ids = np.random.default_rng(3).integers(0, 512, size=40).tolist()
    cpu = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2)
    runners = {
        name: _core.ModelRunner(str(p), max_lanes=1, max_batch_tokens=64, device="cuda")
        for name, p in (("quantized", path), ("bf16 twin", twin))
    }
    want = [cpu.forward(0, 0, ids, all_logits=True)]
    want += [cpu.forward(0, len(ids) + i, [t]) for i, t in enumerate(DECODE)]
    errors = {}
    for name, runner in runners.items():
        replays = _core.cuda_graph_replays()
        got = [runner.forward(0, 0, ids, all_logits=True)]  # prefill
        got += [runner.forward(0, len(ids) + i, [t]) for i, t in enumerate(DECODE)]
        replays = _core.cuda_graph_replays() - replays
        # graphs: the first decode steps run eagerly (matmul timing, first sight), then one is
        # captured and the rest replay it
        assert (replays == 0) if mode.startswith("eager") else (replays >= 2), (name, replays)
        errors[name] = [float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True)]
        assert all(np.isfinite(g).all() for g in got)
    scale = float(np.abs(want[0]).max())
    print(f"{dtype} {mode}: |GPU - CPU| per step", errors)
    for step, (q, t) in enumerate(zip(errors["quantized"], errors["bf16 twin"], strict=True)):
        assert q <= 1.5 * t + 2e-3 * scale, f"step {step}: quantized {q:.3g} vs bf16 twin {t:.3g}"
