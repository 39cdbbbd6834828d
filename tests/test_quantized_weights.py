"""FP8 (e4m3, 128×128 block scales) and NVFP4 (e2m1, per-16 e4m3 + per-row f32) weights on
the CPU: the element codecs against torch, the converter on synthetic Qwen-FP8 and ModelOpt
NVFP4 checkpoints written here with torch and safetensors, quantization of bf16 sources and
random artifacts, the CPU matmul against float64, and model parity (the quantized artifact vs
transformers holding the same dequantized weights; vs the bf16 original within a KL bound).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from artifact_twins import f32_twin  # noqa: E402
from ninfer import _core  # noqa: E402
from ninfer.artifact import read_header  # noqa: E402
from ninfer.artifact.block_quant import (  # noqa: E402
    E2M1_VALUES,
    E4M3_VALUES,
    dequantize_fp8,
    dequantize_nvfp4,
    e4m3_to_f32,
    f32_to_e2m1,
    f32_to_e4m3,
    quantize_fp8,
    quantize_nvfp4,
)
from ninfer.artifact.layout import quantized_layout  # noqa: E402
from ninfer.convert import convert_source  # noqa: E402
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.convert.safetensors_folder import CheckpointError  # noqa: E402
from ninfer.convert.synthetic_tokenizer import synthetic_tokenizer_json  # noqa: E402

VOCAB = 384
CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    tie_word_embeddings=False,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# --- element codecs -------------------------------------------------------------------------


def test_e4m3_encoding_matches_torch_bit_for_bit():
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            (rng.standard_normal(50000) * 50).astype(np.float32),
            E4M3_VALUES[:127],
            -E4M3_VALUES[:127],
            (E4M3_VALUES[:126] + E4M3_VALUES[1:127]) / 2,  # ties: to the even code
            np.float32([448, 449, 1e6, 2.0**-10, 2.0**-9 * 1.5]),
        ]
    ).astype(np.float32)
    ours = f32_to_e4m3(x)
    theirs = torch.from_numpy(x).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    negative_zero = (theirs == 0x80) & (ours == 0)  # we store -0 as +0: the same value
    assert np.array_equal(ours[~negative_zero], theirs[~negative_zero])


def test_e2m1_rounds_to_nearest_even_and_keeps_halves():
    x = np.float32([0.5, -0.5, 0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 7.0, -6.0, 0.2, 0.0])
    codes = f32_to_e2m1(x)
    assert E2M1_VALUES[codes].tolist() == [
        0.5,
        -0.5,
        0.0,
        1.0,
        1.0,
        2.0,
        4.0,
        4.0,
        6.0,
        -6.0,
        0.0,
        0.0,
    ]


@pytest.mark.parametrize("shape", [(256, 128), (3, 200, 96), (130, 48)])
def test_fp8_round_trip_error_is_within_half_a_code(shape):
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    blob = quantize_fp8(w)
    assert blob.nbytes == quantized_layout("fp8", shape)["nbytes"]
    back = dequantize_fp8(blob, shape)
    # e4m3 has 3 mantissa bits: relative error <= 2^-4 of each value, plus underflow near 0
    blockmax = np.abs(w).max()
    assert np.all(np.abs(back - w) <= np.abs(w) / 16 + blockmax * 2.0**-9 / 448 * 2)


def test_nvfp4_round_trip_and_exact_grid_values():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 96)).astype(np.float32)
    back = dequantize_nvfp4(quantize_nvfp4(w), w.shape)
    rel = np.sqrt(((back - w) ** 2).mean() / (w**2).mean())
    assert 0.03 < rel < 0.15  # e2m1: ~9 % rms for Gaussian weights
    # values on the e2m1 grid (±0.5 included) come back up to the f32 row scale's rounding
    grid = np.tile(np.float32([6, -6, 0.5, -0.5, 1.5, 3, 0, 4]), 4).reshape(1, 32)
    np.testing.assert_allclose(dequantize_nvfp4(quantize_nvfp4(grid), grid.shape), grid, rtol=3e-7)


# --- synthetic checkpoints ---------------------------------------------------------------------


def _hf_model(seed: int = 0):
    config = transformers.Qwen3Config(**CONFIG)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:  # bf16-representable, so the bf16 artifact is this very model
                p.copy_(p.to(torch.bfloat16).float())
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in LINEAR


def _fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen's FP8 recipe: e4m3 codes and bf16 weight_scale_inv per 128×128 block."""
    n, k = w.shape
    rb, cb = -(-n // 128), -(-k // 128)
    scale = torch.zeros(rb, cb)
    codes = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    for i in range(rb):
        for j in range(cb):
            block = w[128 * i : 128 * i + 128, 128 * j : 128 * j + 128]
            s = (block.abs().max() / 448).to(torch.bfloat16).float().clamp_min(2.0**-20)
            scale[i, j] = s
            codes[128 * i : 128 * i + 128, 128 * j : 128 * j + 128] = (block / s).to(
                torch.float8_e4m3fn
            )
    return codes, scale.to(torch.bfloat16)


def _nvfp4_modelopt(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ModelOpt's NVFP4 recipe: packed e2m1 (even k low), e4m3 per-16 scales, f32 scale_2."""
    n, k = w.shape
    g = w.abs().max() / (6 * 448)
    groups = w.reshape(n, k // 16, 16)
    s16 = (groups.abs().amax(-1) / (6 * g)).to(torch.float8_e4m3fn)
    scaled = groups / (s16.float()[..., None] * g)
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    mag = (scaled.abs()[..., None] - grid).abs().argmin(-1)
    codes = (mag | ((scaled < 0) & (mag > 0)).to(torch.int64) << 3).reshape(n, k).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, s16, g.reshape(()).float()


def _nvfp4_dequant(packed, s16, g):
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    codes = torch.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1).long()
    values = grid[codes].reshape(packed.shape[0], -1, 16)
    return (values * s16.float()[..., None] * g).reshape(packed.shape[0], -1)


def _write_folder(
    folder: Path, model, tensors: dict[str, torch.Tensor], quant: dict | None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    if quant:
        config["quantization_config"] = quant
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors")
    )
    return folder


def _bf16_state(model) -> dict[str, torch.Tensor]:
    return {
        k: (v.float() if "norm" in k else v.to(torch.bfloat16))
        for k, v in model.state_dict().items()
    }


@pytest.fixture(scope="module")
def model():
    return _hf_model()


@pytest.fixture(scope="module")
def fp8_checkpoint(model, tmp_path_factory):
    """(folder, dequantized weights) of a Qwen-FP8-style checkpoint of `model`."""
    tensors, dequantized = {}, {}
    for name, value in _bf16_state(model).items():
        if _is_linear(name):
            codes, scale = _fp8_blocks(value.float())
            tensors[name], tensors[name + "_scale_inv"] = codes, scale
            s = scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)
            dequantized[name] = codes.float() * s[: codes.shape[0], : codes.shape[1]]
        else:
            tensors[name] = value
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    folder = _write_folder(tmp_path_factory.mktemp("fp8") / "hf", model, tensors, quant)
    return folder, dequantized, tensors


@pytest.fixture(scope="module")
def nvfp4_checkpoint(model, tmp_path_factory):
    tensors, dequantized = {}, {}
    for name, value in _bf16_state(model).items():
        if _is_linear(name):
            packed, s16, g = _nvfp4_modelopt(value.float())
            stem = name.removesuffix(".weight")
            tensors[name], tensors[stem + ".weight_scale"] = packed, s16
            tensors[stem + ".weight_scale_2"] = g
            tensors[stem + ".input_scale"] = torch.tensor(0.01)
            dequantized[name] = _nvfp4_dequant(packed, s16, g)
        else:
            tensors[name] = value
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    folder = _write_folder(tmp_path_factory.mktemp("nvfp4") / "hf", model, tensors, quant)
    return folder, dequantized, tensors


def _with_weights(model, weights: dict[str, torch.Tensor]):
    twin = _hf_model()
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if name in weights:
                p.copy_(weights[name])
    return twin


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].double().numpy()


def _ours(artifact: Path, ids) -> np.ndarray:
    runner = _core.ModelRunner(str(artifact), max_lanes=1, max_batch_tokens=256, threads=2)
    return runner.forward(0, 0, ids, all_logits=True).astype(np.float64)


def _ids(n: int = 96) -> list[int]:
    return np.random.default_rng(7).integers(0, VOCAB, size=n).tolist()


def _assert_close(ours, ref, what):
    err = np.abs(ours - ref).max()
    assert err <= 2e-5 * max(np.abs(ref).max(), 1.0), f"{what}: max |diff| {err:.3g}"


def _mean_kl(reference_logits, logits) -> float:
    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    p = log_softmax(reference_logits)
    return float((np.exp(p) * (p - log_softmax(logits))).sum(-1).mean())


def test_qwen_fp8_checkpoint_converts_byte_for_byte(fp8_checkpoint, tmp_path):
    folder, dequantized, tensors = fp8_checkpoint
    artifact = convert_source(folder, tmp_path / "fp8.ninfer", progress=False)
    header = read_header(artifact)
    q = header.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q["dtype"] == "fp8" and q["shape"] == [128, 128] and q["quant"]["scheme"] == "fp8_block"
    for kept in ("model.embed_tokens.weight", "lm_head.weight"):
        assert header.tensors[kept]["dtype"] == "bf16"
    name = "model.layers.1.mlp.down_proj.weight"
    raw = header.tensor(name)
    codes = tensors[name].view(torch.uint8).numpy().reshape(-1)
    assert np.array_equal(raw[: codes.size], codes)  # the checkpoint's codes, unchanged
    np.testing.assert_array_equal(header.tensor_f32(name), dequantized[name].numpy())


def test_qwen_fp8_model_matches_transformers_on_the_same_weights(model, fp8_checkpoint, tmp_path):
    folder, dequantized, _ = fp8_checkpoint
    artifact = convert_source(folder, tmp_path / "fp8.ninfer", progress=False)
    ids = _ids()
    ours = _ours(artifact, ids)
    _assert_close(ours, _hf_logits(_with_weights(model, dequantized), ids), "fp8 vs dequantized HF")
    kl = _mean_kl(_hf_logits(model, ids), ours)
    assert kl < 2e-2, f"KL(bf16 || fp8) = {kl:.2e}"  # measured 6.8e-3 on this random model
    info = _core.ModelRunner(str(artifact), max_lanes=1, threads=1).info
    assert info["weight_format"] == "fp8"
    assert info["weight_bytes"] == sum(t["nbytes"] for t in read_header(artifact).tensors.values())


def test_modelopt_nvfp4_checkpoint_converts_and_matches_transformers(
    model, nvfp4_checkpoint, tmp_path
):
    folder, dequantized, tensors = nvfp4_checkpoint
    artifact = convert_source(folder, tmp_path / "nvfp4.ninfer", progress=False)
    header = read_header(artifact)
    name = "model.layers.0.mlp.gate_proj.weight"
    entry = header.tensors[name]
    assert entry["dtype"] == "nvfp4" and entry["shape"] == [256, 128]
    raw = header.tensor(name)
    packed = tensors[name].numpy().reshape(-1)
    assert np.array_equal(raw[: packed.size], packed)
    np.testing.assert_allclose(
        header.tensor_f32(name), dequantized[name].numpy(), rtol=1e-6, atol=0
    )
    ids = _ids()
    ours = _ours(artifact, ids)
    _assert_close(
        ours, _hf_logits(_with_weights(model, dequantized), ids), "nvfp4 vs dequantized HF"
    )
    kl = _mean_kl(_hf_logits(model, ids), ours)
    assert kl < 0.25, f"KL(bf16 || nvfp4) = {kl:.2e}"  # measured 0.087 on this random model


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_bf16_source_quantized_on_conversion(model, dtype, tmp_path):
    folder = _write_folder(tmp_path / "hf", model, _bf16_state(model), None)
    artifact = convert_source(folder, tmp_path / f"{dtype}.ninfer", dtype=dtype, progress=False)
    header = read_header(artifact)
    weights = {}
    for name, entry in header.tensors.items():
        if _is_linear(name):
            assert entry["dtype"] == dtype
            weights[name] = torch.from_numpy(header.tensor_f32(name).copy())
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            assert entry["dtype"] == "bf16"
    ids = _ids()
    ours = _ours(artifact, ids)
    _assert_close(
        ours, _hf_logits(_with_weights(model, weights), ids), f"{dtype} vs dequantized HF"
    )
    # The fp8 artifact of a bf16 source and Qwen's recipe agree on the values (both amax/448).
    # measured 6.6e-3 (fp8) and 0.086 (nvfp4) on this random model
    assert _mean_kl(_hf_logits(model, ids), ours) < (2e-2 if dtype == "fp8" else 0.25)


def test_a_quantized_checkpoint_can_be_dequantized_to_bf16(fp8_checkpoint, tmp_path):
    folder, dequantized, _ = fp8_checkpoint
    artifact = convert_source(folder, tmp_path / "bf16.ninfer", dtype="bf16", progress=False)
    header = read_header(artifact)
    name = "model.layers.0.self_attn.o_proj.weight"
    assert header.tensors[name]["dtype"] == "bf16"
    exact = dequantized[name].to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(header.tensor_f32(name), exact)


def test_fp8_weight_without_scale_is_refused(fp8_checkpoint, tmp_path):
    _, _, tensors = fp8_checkpoint
    broken = dict(tensors)
    del broken["model.layers.0.self_attn.k_proj.weight_scale_inv"]
    folder = _write_folder(tmp_path / "hf", _hf_model(), broken, None)
    with pytest.raises(CheckpointError, match=r"k_proj\.weight.*without a weight_scale_inv"):
        convert_source(folder, tmp_path / "x.ninfer", progress=False)


@pytest.mark.parametrize(
    ("extra", "quant", "message"),
    [
        (
            {"model.layers.0.mlp.up_proj.weight_packed": torch.zeros(4, dtype=torch.int32)},
            None,
            "compressed-tensors",
        ),
        ({}, {"quant_method": "fp8", "weight_block_size": [64, 64]}, "only 128×128"),
    ],
)
def test_unsupported_quantized_layouts_are_refused(fp8_checkpoint, tmp_path, extra, quant, message):
    _, _, tensors = fp8_checkpoint
    folder = _write_folder(tmp_path / "hf", _hf_model(), tensors | extra, quant)
    with pytest.raises(CheckpointError, match=message):
        convert_source(folder, tmp_path / "x.ninfer", progress=False)


# --- random artifacts and the CPU matmul ----------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_random_quantized_artifacts_are_deterministic(dtype, tmp_path):
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **CONFIG,
        "vocab_size": 512,
    }
    a = make_random_artifact(cfg, tmp_path / "a.ninfer", dtype=dtype, tokenizer="synthetic")
    b = make_random_artifact(cfg, tmp_path / "b.ninfer", dtype=dtype, tokenizer="synthetic")
    assert a.read_bytes() == b.read_bytes()
    header = read_header(a)
    assert header.tensors["model.layers.0.mlp.down_proj.weight"]["dtype"] == dtype
    runner = _core.ModelRunner(str(a), max_lanes=1, threads=1)
    by_format: dict[str, int] = {}
    for entry in header.tensors.values():
        by_format[entry["dtype"]] = by_format.get(entry["dtype"], 0) + entry["nbytes"]
    # ftype is the format holding the most bytes: this tiny model's bf16 embedding and head
    # outweigh its nvfp4 matrices
    assert runner.info["weight_format"] == max(by_format, key=by_format.get)
    assert runner.info["weight_bytes"] == sum(by_format.values())
    assert np.isfinite(runner.forward(0, 0, [1, 2, 3])).all()


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
@pytest.mark.parametrize(
    ("m", "experts", "n", "k"), [(1, 1, 200, 96), (5, 3, 64, 128), (70, 2, 136, 256)]
)
def test_cpu_matmul_matches_float64_on_dequantized_weights(dtype, m, experts, n, k):
    rng = np.random.default_rng(m * 31 + n)
    w = rng.standard_normal((experts, n, k)).astype(np.float32) * 0.05
    blob = (quantize_fp8 if dtype == "fp8" else quantize_nvfp4)(w)
    ref_w = (dequantize_fp8 if dtype == "fp8" else dequantize_nvfp4)(blob, w.shape).reshape(-1, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.full((m, experts * n), np.nan, dtype=np.float32)
    _core.matmul(x, blob, dtype, out, group_rows=n, threads=2)
    ref = x.astype(np.float64) @ ref_w.astype(np.float64).T
    bound = 1e-6 * np.sqrt(k) * (np.abs(x) @ np.abs(ref_w).T).max() + 1e-7
    assert np.abs(out - ref).max() <= bound


@pytest.mark.parametrize("m", [16, 40])
def test_cpu_w8a8_mirror_rounds_x_like_the_cuda_fp8_gemm(m, monkeypatch):
    """NINFER_CPU_W8A8=1: x meets FP8 weights as e4m3 per row and 128 columns (scale amax/448,
    the CUDA prefill GEMM's operand) above 16 rows; at 16 rows (the GPU's GEMV) and without it,
    x stays f32."""
    rng = np.random.default_rng(m)
    n, k = 64, 256
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    blob = quantize_fp8(w)
    w64 = dequantize_fp8(blob, w.shape).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32) * np.exp(rng.uniform(-2, 2, (m, 1)))
    x = x.astype(np.float32)
    groups = x.reshape(m, k // 128, 128)
    s = (np.abs(groups).max(axis=2, keepdims=True) / np.float32(448.0)).astype(np.float32)
    x8 = (e4m3_to_f32(f32_to_e4m3((groups / s).astype(np.float32))) * s).reshape(m, k)
    out = np.full((m, n), np.nan, dtype=np.float32)
    monkeypatch.setenv("NINFER_CPU_W8A8", "1")
    _core.matmul(x, blob, "fp8", out, group_rows=n, threads=2)
    mirrored = x8.astype(np.float64) @ w64.T if m > 16 else x.astype(np.float64) @ w64.T
    bound = 1e-6 * np.sqrt(k) * (np.abs(x) @ np.abs(w64).T).max() + 1e-7
    assert np.abs(out - mirrored).max() <= bound
    if m > 16:  # and the rounding is visible
        assert np.abs(out - x.astype(np.float64) @ w64.T).max() > 100 * bound
    monkeypatch.delenv("NINFER_CPU_W8A8")
    _core.matmul(x, blob, "fp8", out, group_rows=n, threads=2)
    assert np.abs(out - x.astype(np.float64) @ w64.T).max() <= bound


MOE_CONFIG = {
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "vocab_size": 512,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 96,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "mtp_num_hidden_layers": 0,
}


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_quantized_moe_hybrid_equals_its_dequantized_twin(dtype, tmp_path):
    """Stacked experts (block scales restarting per expert, row slices per expert) and the
    GDN projections: the quantized artifact against an f32 artifact of its decoded values."""
    quantized = make_random_artifact(
        MOE_CONFIG, tmp_path / "q.ninfer", dtype=dtype, tokenizer="synthetic"
    )
    header = read_header(quantized)
    assert header.tensors["model.layers.0.mlp.experts.gate_up_proj"]["dtype"] == dtype
    assert header.tensors["model.layers.0.mlp.gate.weight"]["dtype"] == "bf16"  # router
    assert header.tensors["model.layers.0.linear_attn.in_proj_a.weight"]["dtype"] == "bf16"
    twin = f32_twin(quantized, tmp_path / "f32.ninfer")
    ids = _ids(80)
    a, b = _ours(quantized, ids), _ours(twin, ids)
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * max(np.abs(b).max(), 1.0))


# --- a Qwen3.6-MoE release layout: per-expert quantized tensors, multimodal names ------------


def _moe_release(fmt: str, folder: Path):
    """A tiny Qwen3.5-MoE checkpoint as the FP8 / NVFP4 releases lay it out: per-expert
    matrices under model.language_model., every projection quantized but the router, the
    shared-expert gate and the GDN a/b projections; returns (folder, dequantized weights by
    artifact name)."""
    from qwen3_5_cases import hf_model

    model = hf_model(
        "qwen3_5_moe",
        overrides=dict(
            hidden_size=128,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            vocab_size=512,
        ),
    )
    kept = ("mlp.gate.weight", "shared_expert_gate.weight", "in_proj_a.weight", "in_proj_b.weight")
    tensors: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}

    def put(name: str, w: torch.Tensor) -> torch.Tensor:
        w = w.to(torch.bfloat16).float()
        stem = name.removesuffix(".weight")
        if fmt == "fp8":
            codes, scale = _fp8_blocks(w)
            tensors[name], tensors[stem + ".weight_scale_inv"] = codes, scale
            s = scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)
            return codes.float() * s[: w.shape[0], : w.shape[1]]
        packed, s16, g = _nvfp4_modelopt(w)
        tensors[name], tensors[stem + ".weight_scale"] = packed, s16
        tensors[stem + ".weight_scale_2"], tensors[stem + ".input_scale"] = g, torch.tensor(1.0)
        return _nvfp4_dequant(packed, s16, g)

    for name, value in model.state_dict().items():
        release = name.replace("model.", "model.language_model.", 1)
        if name.endswith("experts.gate_up_proj"):
            ff = value.shape[1] // 2
            parts = []
            for e in range(value.shape[0]):
                base = release.removesuffix("gate_up_proj") + f"{e}."
                gate = put(base + "gate_proj.weight", value[e, :ff])
                up = put(base + "up_proj.weight", value[e, ff:])
                parts.append(torch.cat([gate, up]))
            dequantized[name] = torch.stack(parts)
        elif name.endswith("experts.down_proj"):
            base = release.removesuffix("down_proj")
            dequantized[name] = torch.stack(
                [put(base + f"{e}.down_proj.weight", value[e]) for e in range(value.shape[0])]
            )
        elif (
            value.ndim == 2
            and not name.endswith(kept)
            and "embed" not in name
            and not name.startswith("lm_head")
        ):
            dequantized[name] = put(release, value)
        else:
            tensors[release] = (
                value.float() if "norm" in name or value.ndim < 2 else value.to(torch.bfloat16)
            )
    folder.mkdir(parents=True)
    config = model.config.to_dict()
    config["quantization_config"] = (
        {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
        if fmt == "fp8"
        else {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    )
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors")
    )
    return folder, dequantized


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_moe_release_converts_with_stacked_quantized_experts(fmt, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    folder, dequantized = _moe_release(fmt, tmp_path / "hf")
    artifact = convert_source(folder, tmp_path / "q.ninfer", progress=False)
    header = read_header(artifact)
    assert header.architecture == "qwen3_5_moe"
    for name, want in dequantized.items():
        assert header.tensors[name]["dtype"] == fmt, name
        got = header.tensor_f32(name)
        if fmt == "fp8":
            np.testing.assert_array_equal(got, want.numpy(), err_msg=name)
        else:
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=0, err_msg=name)
    assert header.tensors["model.layers.0.mlp.gate.weight"]["dtype"] == "bf16"
    twin = f32_twin(artifact, tmp_path / "twin.ninfer")
    ids = _ids(64)
    a, b = _ours(artifact, ids), _ours(twin, ids)
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * max(np.abs(b).max(), 1.0))


def test_unknown_modelopt_algorithm_is_refused(fp8_checkpoint, tmp_path):
    _, _, tensors = fp8_checkpoint
    quant = {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}
    folder = _write_folder(tmp_path / "hf", _hf_model(), tensors, quant)
    with pytest.raises(CheckpointError, match="W4A8_AWQ"):
        convert_source(folder, tmp_path / "x.ninfer", progress=False)


def test_modelopt_mixed_precision_fp8_layers(nvfp4_checkpoint, tmp_path):
    """ModelOpt's MIXED_PRECISION releases keep some layers FP8 with one scale per tensor."""
    _, _, tensors = nvfp4_checkpoint
    mixed = {k: v for k, v in tensors.items() if "layers.0.self_attn.o_proj" not in k}
    w = _hf_model().state_dict()["model.layers.0.self_attn.o_proj.weight"]
    scale = (w.abs().max() / 448).reshape(())
    codes = (w / scale).to(torch.float8_e4m3fn)
    stem = "model.layers.0.self_attn.o_proj"
    mixed[stem + ".weight"], mixed[stem + ".weight_scale"] = codes, scale.float()
    mixed[stem + ".input_scale"] = torch.tensor(0.02)
    quant = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}
    folder = _write_folder(tmp_path / "hf", _hf_model(), mixed, quant)
    header = read_header(convert_source(folder, tmp_path / "m.ninfer", progress=False))
    assert header.tensors[stem + ".weight"]["dtype"] == "fp8"
    assert header.tensors["model.layers.0.self_attn.q_proj.weight"]["dtype"] == "nvfp4"
    want = (codes.float() * scale.float()).numpy()
    np.testing.assert_array_equal(header.tensor_f32(stem + ".weight"), want)
