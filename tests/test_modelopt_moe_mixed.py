"""ModelOpt's mixed-precision MoE release layout (the Qwen3.6-35B-A3B NVFP4 checkpoint): routed
experts NVFP4 (e2m1, e4m3 per-16 scales, one f32 scale per expert matrix), the attention, GDN
and shared-expert projections FP8 with one f32 scale per tensor, the router, the shared-expert
gate and the GDN a/b projections bf16. The converter keeps each format as stored, and the CPU
model on the artifact equals the same model on its decoded values (tests/test_cuda_moe_decode.py
runs the artifact on the GPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from ninfer import _core  # noqa: E402
from ninfer.artifact import read_header  # noqa: E402
from ninfer.convert import convert_source  # noqa: E402
from ninfer.convert.synthetic_tokenizer import synthetic_tokenizer_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from artifact_twins import f32_twin  # noqa: E402

KEPT = ("mlp.gate.weight", "shared_expert_gate.weight", "in_proj_a.weight", "in_proj_b.weight")


def modelopt_mixed_moe_release(folder: Path) -> tuple[Path, dict[str, str]]:
    """The release folder and the format each artifact weight must keep."""
    from qwen3_5_cases import hf_model
    from test_quantized_weights import _nvfp4_modelopt

    model = hf_model(
        "qwen3_5_moe",
        overrides=dict(
            hidden_size=128,
            # widths the CUDA attention and GDN take, for the GPU twin of this test
            head_dim=64,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=96,
            vocab_size=512,
        ),
    )
    tensors: dict[str, torch.Tensor] = {}
    formats: dict[str, str] = {}

    def nvfp4(name: str, w: torch.Tensor) -> None:
        packed, s16, g = _nvfp4_modelopt(w.to(torch.bfloat16).float())
        stem = name.removesuffix(".weight")
        tensors[name], tensors[stem + ".weight_scale"] = packed, s16
        tensors[stem + ".weight_scale_2"], tensors[stem + ".input_scale"] = g, torch.tensor(1.0)

    def fp8_per_tensor(name: str, w: torch.Tensor) -> None:
        w = w.to(torch.bfloat16).float()
        scale = (w.abs().max() / 448).reshape(())
        stem = name.removesuffix(".weight")
        tensors[name] = (w / scale).to(torch.float8_e4m3fn)
        tensors[stem + ".weight_scale"] = scale.float()
        tensors[stem + ".input_scale"] = torch.tensor(0.02)

    for name, value in model.state_dict().items():
        release = name.replace("model.", "model.language_model.", 1)
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            formats[name] = "nvfp4"
            base = release.rsplit(".", 1)[0] + "."
            for e in range(value.shape[0]):
                if name.endswith("gate_up_proj"):
                    ff = value.shape[1] // 2
                    nvfp4(base + f"{e}.gate_proj.weight", value[e, :ff])
                    nvfp4(base + f"{e}.up_proj.weight", value[e, ff:])
                else:
                    nvfp4(base + f"{e}.down_proj.weight", value[e])
        elif (
            value.ndim == 2
            and name.endswith(".weight")
            and not name.endswith(KEPT)
            and "embed" not in name
            and not name.startswith("lm_head")
            and "conv1d" not in name
        ):
            formats[name] = "fp8"
            fp8_per_tensor(release, value)
        else:
            tensors[release] = (
                value.float() if "norm" in name or value.ndim < 2 else value.to(torch.bfloat16)
            )
            if name.endswith(KEPT):
                formats[name] = "bf16"
    folder.mkdir(parents=True)
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors")
    )
    return folder, formats


def test_modelopt_mixed_moe_release_keeps_each_format(tmp_path):
    folder, formats = modelopt_mixed_moe_release(tmp_path / "hf")
    artifact = convert_source(folder, tmp_path / "m.ninfer", progress=False)
    header = read_header(artifact)
    assert header.architecture == "qwen3_5_moe"
    assert {"fp8", "nvfp4", "bf16"} <= set(formats.values())
    for name, fmt in formats.items():
        assert header.tensors[name]["dtype"] == fmt, name
    twin = f32_twin(artifact, tmp_path / "twin.ninfer")
    ids = np.random.default_rng(5).integers(0, 512, size=48).tolist()
    runners = [
        _core.ModelRunner(str(p), max_lanes=1, max_batch_tokens=64, threads=2)
        for p in (artifact, twin)
    ]
    a, b = (r.forward(0, 0, ids, all_logits=True).astype(np.float64) for r in runners)
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * max(np.abs(b).max(), 1.0))
