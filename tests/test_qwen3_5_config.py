"""Qwen3.5/3.6 config flattening and tensor set against the spec tables and transformers."""

from __future__ import annotations

import pytest

from ninfer.convert.qwen3_5_config import (
    UnsupportedQwenConfigError,
    hybrid_architecture_of,
    normalize_qwen3_5_config,
    qwen3_5_expected_tensors,
)
from ninfer.convert.qwen3_5_presets import preset_names, qwen3_5_preset

ROPE = qwen3_5_preset("qwen3.6-27b")["text_config"]["rope_parameters"]


def config_27b() -> dict:
    """Qwen3.6-27B's config.json shape (spec §1.1), with explicit layer_types."""
    config = qwen3_5_preset("qwen3.6-27b")
    config["text_config"]["layer_types"] = ["linear_attention"] * 3 + ["full_attention"]
    return config


def config_35b() -> dict:
    """Qwen3.6-35B-A3B's config.json shape (spec §1.2), layer_types from the interval."""
    return qwen3_5_preset("qwen3.6-35b-a3b")


def test_27b_flattened():
    hf = config_27b()
    hf["text_config"]["layer_types"] = hf["text_config"]["layer_types"] * 16
    assert hybrid_architecture_of(hf) == "qwen3_5"
    c = normalize_qwen3_5_config("qwen3_5", hf)
    assert c["hidden_size"] == 5120 and c["intermediate_size"] == 17408
    assert [i for i, t in enumerate(c["layer_types"]) if t == "full_attention"] == list(
        range(3, 64, 4)
    )
    assert c["layer_types"].count("linear_attention") == 48
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (24, 4, 256)
    assert (c["linear_num_key_heads"], c["linear_num_value_heads"]) == (16, 48)
    assert c["rope_theta"] == 1e7 and c["rotary_dim"] == 64 and c["rope_scaling"] is None
    assert c["mrope_section"] == [11, 11, 10] and c["mrope_interleaved"] is True
    assert c["qk_norm"] and c["attn_output_gate"] and not c["tie_word_embeddings"]
    assert c["mtp_num_hidden_layers"] == 1
    assert "num_experts" not in c


def test_35b_moe_flattened_with_interval_layer_types():
    hf = config_35b()
    assert hybrid_architecture_of(hf) == "qwen3_5_moe"
    c = normalize_qwen3_5_config("qwen3_5_moe", hf)
    assert c["layer_types"].count("full_attention") == 10
    assert c["layer_types"][3] == "full_attention" and c["layer_types"][39] == "full_attention"
    assert c["intermediate_size"] == 0
    assert (c["num_experts"], c["num_experts_per_tok"]) == (256, 8)
    assert c["moe_intermediate_size"] == 512 and c["shared_expert_intermediate_size"] == 512
    assert c["norm_topk_prob"] is True
    assert c["linear_value_head_dim"] == 128 and c["linear_conv_kernel_dim"] == 4


def test_parameter_count_of_27b_matches_spec():
    hf = config_27b()
    hf["text_config"]["layer_types"] = hf["text_config"]["layer_types"] * 16
    shapes = qwen3_5_expected_tensors(normalize_qwen3_5_config("qwen3_5", hf))
    total = 0
    for shape in shapes.values():
        count = 1
        for n in shape:
            count *= n
        total += count
    # spec §1.1: 24.4B layers + 2 x 1.27B embed/head + 0.42B MTP (vision excluded)
    assert 27.2e9 < total < 27.5e9
    assert shapes["model.layers.0.linear_attn.in_proj_qkv.weight"] == (10240, 5120)
    assert shapes["model.layers.3.self_attn.q_proj.weight"] == (12288, 5120)
    assert shapes["mtp.fc.weight"] == (5120, 10240)


def test_text_only_config_and_rope_variants():
    flat = dict(config_27b()["text_config"], layer_types=None, num_hidden_layers=8)
    del flat["rope_parameters"]
    flat.update(rope_theta=5e6, partial_rotary_factor=0.5, rope_scaling=None)
    c = normalize_qwen3_5_config("qwen3_5", flat)
    assert c["rope_theta"] == 5e6 and c["rotary_dim"] == 128
    yarn = dict(ROPE, rope_type="yarn", factor=4.0, original_max_position_embeddings=262144)
    flat["rope_parameters"] = yarn
    c = normalize_qwen3_5_config("qwen3_5", flat)
    assert c["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 262144,
    }
    assert c["rope_theta"] == 1e7


def small_fields(**extra) -> dict:
    fields = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        vocab_size=100,
    )
    fields.update(extra)
    return fields


@pytest.mark.parametrize("moe", [False, True])
def test_defaults_and_tensors_match_transformers(moe):
    torch = pytest.importorskip("torch")
    if moe:
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf

        fields = small_fields(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=16,
        )
        del fields["intermediate_size"]
        hf_config = hf.Qwen3_5MoeTextConfig(**fields)
        model_cls, architecture = hf.Qwen3_5MoeForCausalLM, "qwen3_5_moe"
    else:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

        fields = small_fields(full_attention_interval=3)
        hf_config = hf.Qwen3_5TextConfig(**fields)
        model_cls, architecture = hf.Qwen3_5ForCausalLM, "qwen3_5"
    c = normalize_qwen3_5_config(architecture, {"model_type": hf_config.model_type, **fields})
    assert c["layer_types"] == hf_config.layer_types
    assert c["rope_theta"] == hf_config.rope_parameters["rope_theta"]
    assert c["partial_rotary_factor"] == hf_config.rope_parameters["partial_rotary_factor"]
    for key in ("rms_norm_eps", "max_position_embeddings", "linear_conv_kernel_dim"):
        assert c[key] == getattr(hf_config, key), key
    with torch.device("meta"):
        model = model_cls(hf_config)
    hf_shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    ours = {k: v for k, v in qwen3_5_expected_tensors(c).items() if not k.startswith("mtp.")}
    assert ours == hf_shapes


@pytest.mark.parametrize(
    "change,error",
    [
        (dict(linear_num_value_heads=5), "not a multiple"),
        (dict(layer_types=["full_attention"] * 3), "3 entries for 6"),
        (dict(layer_types=["sliding"] * 6), "unknown layer types"),
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(num_key_value_heads=3), "not divisible"),
        (dict(partial_rotary_factor=0.01), "rotary dim"),
        (dict(hidden_size=None), "lacks hidden_size"),
    ],
)
def test_bad_configs_are_refused(change, error):
    with pytest.raises(UnsupportedQwenConfigError, match=error):
        normalize_qwen3_5_config("qwen3_5", small_fields(**change))


def test_other_models_are_not_hybrid():
    assert hybrid_architecture_of({"architectures": ["LlamaForCausalLM"]}) is None
    assert hybrid_architecture_of({"model_type": "qwen3_5_text"}) == "qwen3_5"


def test_presets_are_fresh_copies_and_named():
    assert preset_names() == ["qwen3.6-27b", "qwen3.6-35b-a3b"]
    first = qwen3_5_preset("Qwen3.6-27B")
    first["text_config"]["hidden_size"] = 1
    assert qwen3_5_preset("qwen3.6-27b")["text_config"]["hidden_size"] == 5120
    with pytest.raises(KeyError, match="known: qwen3.6-27b"):
        qwen3_5_preset("qwen3.6-4b")


def test_35b_tensor_shapes_match_spec_table():
    config = normalize_qwen3_5_config("qwen3_5_moe", config_35b())
    shapes = qwen3_5_expected_tensors(config)
    p = "model.layers.0."
    assert shapes[p + "linear_attn.in_proj_qkv.weight"] == (8192, 2048)
    assert shapes[p + "linear_attn.in_proj_z.weight"] == (4096, 2048)
    assert shapes[p + "linear_attn.in_proj_b.weight"] == (32, 2048)
    assert shapes[p + "linear_attn.conv1d.weight"] == (8192, 1, 4)
    assert shapes[p + "mlp.experts.gate_up_proj"] == (256, 1024, 2048)
    assert shapes[p + "mlp.experts.down_proj"] == (256, 2048, 512)
    assert shapes[p + "mlp.shared_expert_gate.weight"] == (1, 2048)
    assert shapes["model.layers.3.self_attn.q_proj.weight"] == (8192, 2048)
    assert shapes["model.layers.3.self_attn.k_proj.weight"] == (512, 2048)
    assert shapes["mtp.layers.0.mlp.experts.gate_up_proj"] == (256, 1024, 2048)
