"""Qwen3.5/3.6 conversion: transformers checkpoints (multimodal and text-only, per-expert and
stacked experts, MTP shards) to artifacts and back, and random artifacts of these configs."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from ninfer.artifact import read_header
from ninfer.convert import convert_source
from ninfer.convert.hf import plan_hf_conversion
from ninfer.convert.model_config import UnsupportedModelError
from ninfer.convert.synthetic_tokenizer import synthetic_tokenizer_json
from qwen3_5_hf_bridge import artifact_state_dict

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from transformers.models.qwen3_5 import modeling_qwen3_5 as dense_hf  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as moe_hf  # noqa: E402

# Small, with the real ratios: GQA 2:1, 2 V heads per QK head, partial rotary 1/4.
TEXT = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=300,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)
VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32)


def text_fields(moe: bool) -> dict:
    fields = dict(TEXT, **MOE) if moe else dict(TEXT)
    if moe:
        del fields["intermediate_size"]
    return fields


def hf_multimodal(moe: bool):
    """A bf16 Qwen3_5(Moe)ForConditionalGeneration with every tensor random (norms too)."""
    torch.manual_seed(0)
    module = moe_hf if moe else dense_hf
    config_cls = module.Qwen3_5MoeConfig if moe else module.Qwen3_5Config
    model_cls = (module.Qwen3_5MoeForConditionalGeneration if moe
                 else module.Qwen3_5ForConditionalGeneration)
    fields = text_fields(moe)
    config = config_cls(text_config=dict(fields, mtp_num_hidden_layers=1),
                        vision_config=dict(VISION, out_hidden_size=fields["hidden_size"]))
    model = model_cls(config).to(torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():  # zero-initialised norms would hide mix-ups
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    return model


def mtp_tensors(model, per_expert: bool) -> dict[str, torch.Tensor]:
    """A random MTP head in the checkpoint's names (layer 0 shaped like a full-attention
    decoder layer of the model)."""
    generator = torch.Generator().manual_seed(1)
    state = model.state_dict()
    prefix = "model.language_model.layers.3."  # a full_attention layer (interval 4)
    d = TEXT["hidden_size"]
    out = {
        "mtp.fc.weight": (d, 2 * d), "mtp.pre_fc_norm_embedding.weight": (d,),
        "mtp.pre_fc_norm_hidden.weight": (d,), "mtp.norm.weight": (d,),
    }
    for name, value in state.items():
        if name.startswith(prefix):
            out["mtp.layers.0." + name[len(prefix):]] = tuple(value.shape)
    tensors = {n: torch.randn(s, generator=generator).to(torch.bfloat16) for n, s in out.items()}
    return split_experts(tensors) if per_expert else tensors


def split_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stacked expert tensors → the per-expert names (gate rows first in gate_up_proj)."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, ff = name[: -len(".gate_up_proj")], value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = value[e, :ff].clone()
                out[f"{base}.{e}.up_proj.weight"] = value[e, ff:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len(".down_proj")]
            for e in range(value.shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = value[e].clone()
        else:
            out[name] = value
    return out


def add_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False}))


def to_numpy(value: torch.Tensor) -> np.ndarray:
    return value.float().numpy()


def artifact_name(checkpoint_name: str) -> str:
    return checkpoint_name.replace("model.language_model.", "model.")


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def checkpoint(request, tmp_path_factory):
    """(moe, model, folder saved by save_pretrained + an MTP shard, expected artifact tensors)."""
    moe = request.param
    model = hf_multimodal(moe)
    folder = tmp_path_factory.mktemp("moe" if moe else "dense")
    model.save_pretrained(folder)  # transformers 5 writes experts per expert
    add_tokenizer(folder)
    # release-style MTP weights in their own shard (transformers drops mtp.* on save)
    safetensors_torch.save_file(mtp_tensors(model, per_expert=True), folder / "mtp.safetensors")
    expected = {artifact_name(n): to_numpy(v) for n, v in model.state_dict().items()
                if not n.startswith("model.visual.")}
    expected.update({n: to_numpy(v) for n, v in mtp_tensors(model, per_expert=False).items()})
    return moe, model, folder, expected


def test_every_tensor_equals_the_source(checkpoint, tmp_path, caplog):
    moe, _, folder, expected = checkpoint
    with caplog.at_level(logging.INFO, logger="ninfer.convert"):
        path = convert_source(folder, tmp_path / "q.ninfer", progress=False)
    header = read_header(path)
    assert header.architecture == ("qwen3_5_moe" if moe else "qwen3_5")
    architecture, config, tensors = artifact_state_dict(path)
    assert set(tensors) == set(expected)
    for name, values in expected.items():
        assert header.tensors[name]["dtype"] == ("f32" if values.ndim == 1 else "bf16")
        np.testing.assert_array_equal(tensors[name], values, err_msg=name)
    assert not any("visual" in name for name in tensors)
    n_vision = sum(n.startswith("model.visual.") for n in checkpoint[1].state_dict())
    assert f"skipped {n_vision} vision tensors" in caplog.text
    assert config["mtp_num_hidden_layers"] == 1
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["rotary_dim"] == 8 and config["vocab_size"] == 300
    if moe:
        assert config["num_experts"] == 4 and config["intermediate_size"] == 0
        assert tensors["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 64)


def test_stacked_and_per_expert_layouts_give_identical_artifacts(checkpoint, tmp_path):
    moe, model, per_expert_folder, _ = checkpoint
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        (stacked / file).write_bytes((per_expert_folder / file).read_bytes())
    state = {n: v.contiguous() for n, v in model.state_dict().items()}  # stacked in memory
    state.update(mtp_tensors(model, per_expert=False))
    safetensors_torch.save_file(state, stacked / "model.safetensors")
    a = convert_source(per_expert_folder, tmp_path / "a.ninfer", progress=False, name="m")
    b = convert_source(stacked, tmp_path / "b.ninfer", progress=False, name="m")
    ha, hb = read_header(a), read_header(b)
    assert ha.tensors == hb.tensors and ha.config == hb.config
    data_a = a.read_bytes()[ha.data_offset:][: ha.header["data_size"]]
    data_b = b.read_bytes()[hb.data_offset:][: hb.header["data_size"]]
    assert hashlib.sha256(data_a).digest() == hashlib.sha256(data_b).digest()
    if moe:  # the per-expert source really was per expert
        names = plan_hf_conversion(per_expert_folder).stored
        assert "model.language_model.layers.0.mlp.experts.3.up_proj.weight" in names
        assert "model.language_model.layers.0.mlp.experts.gate_up_proj" not in names


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_text_only_checkpoint_without_mtp(moe, tmp_path, caplog):
    """Qwen3_5(Moe)ForCausalLM.save_pretrained: `model.*` names, no MTP, no vision."""
    torch.manual_seed(2)
    module = moe_hf if moe else dense_hf
    config = (module.Qwen3_5MoeTextConfig if moe else module.Qwen3_5TextConfig)(
        **text_fields(moe), mtp_num_hidden_layers=1)
    model = (module.Qwen3_5MoeForCausalLM if moe else module.Qwen3_5ForCausalLM)(config)
    model.save_pretrained(tmp_path / "src")
    add_tokenizer(tmp_path / "src")
    with caplog.at_level(logging.INFO, logger="ninfer.convert"):
        path = convert_source(tmp_path / "src", tmp_path / "t.ninfer", progress=False,
                              dtype="q8_0")
    assert "no mtp.* tensors" in caplog.text
    _, header_config, tensors = artifact_state_dict(path)
    assert header_config["mtp_num_hidden_layers"] == 0
    info = read_header(path).tensors
    assert info["model.layers.0.linear_attn.conv1d.weight"]["dtype"] == "bf16"  # K=4 < block
    assert info["model.layers.0.linear_attn.A_log"]["dtype"] == "f32"
    assert info["model.layers.0.linear_attn.in_proj_qkv.weight"]["dtype"] == "q8_0"
    for name, value in model.state_dict().items():
        source = to_numpy(value)
        scale = np.abs(source).max() / 127 if source.ndim > 1 else 0.0
        np.testing.assert_allclose(tensors[name], source, atol=scale + 1e-2 * scale + 1e-7,
                                   rtol=0, err_msg=name)


def test_layout_problems_are_clear_errors(checkpoint, tmp_path):
    moe, model, folder, _ = checkpoint
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in ("config.json", "tokenizer.json"):
        (broken / file).write_bytes((folder / file).read_bytes())
    state = {n: v.contiguous() for n, v in model.state_dict().items()}
    del state["model.language_model.layers.1.linear_attn.A_log"]
    state["model.language_model.layers.0.linear_attn.dt_bias"] = torch.zeros(3)
    safetensors_torch.save_file(state, broken / "model.safetensors")
    with pytest.raises(UnsupportedModelError, match="shape|lacks"):
        convert_source(broken, tmp_path / "x.ninfer", progress=False)
    assert not (tmp_path / "x.ninfer").exists()
