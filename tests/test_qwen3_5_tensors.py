"""Checkpoint → artifact tensor planning for Qwen3.5/3.6 (prefixes, vision skip, expert layouts)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.convert.qwen3_5_config import normalize_qwen3_5_config, qwen3_5_expected_tensors
from ninfer.convert.qwen3_5_tensors import (
    CheckpointLayoutError,
    Direct,
    StackedExperts,
    checkpoint_names,
    materialize,
    plan_qwen3_5_tensors,
)

FIELDS = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    vocab_size=50,
    mtp_num_hidden_layers=1,
)
MOE = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=12,
    shared_expert_intermediate_size=10,
)


def artifact_tensors(moe: bool, rng: np.random.Generator) -> tuple[dict, dict[str, np.ndarray]]:
    config = normalize_qwen3_5_config(
        "qwen3_5_moe" if moe else "qwen3_5", dict(FIELDS, **(MOE if moe else {}))
    )
    tensors = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in qwen3_5_expected_tensors(config).items()
    }
    return config, tensors


def multimodal_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, array in tensors.items():
        key = "model.language_model." + name[len("model.") :] if name.startswith("model.") else name
        out[key] = array
    out["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((6, 4), np.float32)
    out["model.visual.merger.linear_fc1.weight"] = np.zeros((4, 4), np.float32)
    return out


def per_expert_names(tensors: dict[str, np.ndarray], ff: int) -> dict[str, np.ndarray]:
    out = {}
    for name, array in tensors.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name[: -len(".gate_up_proj")]
            for e in range(array.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = array[e, :ff]
                out[f"{base}.{e}.up_proj.weight"] = array[e, ff:]
        elif name.endswith(".mlp.experts.down_proj"):
            base = name[: -len(".down_proj")]
            for e in range(array.shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = array[e]
        else:
            out[name] = array
    return out


def check_round_trip(checkpoint: dict[str, np.ndarray], config, expected: dict[str, np.ndarray]):
    plan = plan_qwen3_5_tensors({n: a.shape for n, a in checkpoint.items()}, config)
    assert list(plan.sources) == list(expected)
    for name, source in plan.sources.items():
        np.testing.assert_array_equal(materialize(source, checkpoint.__getitem__), expected[name])
    return plan


@pytest.mark.parametrize("moe", [False, True])
def test_multimodal_prefixes_and_vision_skip(moe):
    config, tensors = artifact_tensors(moe, np.random.default_rng())
    plan = check_round_trip(multimodal_names(tensors), config, tensors)
    assert sorted(plan.skipped_vision) == [
        "model.visual.blocks.0.attn.qkv.weight",
        "model.visual.merger.linear_fc1.weight",
    ]
    assert all(isinstance(s, Direct) for s in plan.sources.values())
    assert any(n.startswith("mtp.") for n in plan.sources)


def test_text_only_prefix():
    config, tensors = artifact_tensors(False, np.random.default_rng())
    check_round_trip(dict(tensors), config, tensors)


def test_per_expert_layout_is_stacked():
    config, tensors = artifact_tensors(True, np.random.default_rng())
    checkpoint = multimodal_names(per_expert_names(tensors, MOE["moe_intermediate_size"]))
    plan = check_round_trip(checkpoint, config, tensors)
    stacked = [n for n, s in plan.sources.items() if isinstance(s, StackedExperts)]
    # 4 backbone layers + the MTP layer, two stacked tensors each
    assert len(stacked) == 2 * (FIELDS["num_hidden_layers"] + 1)
    read = set(checkpoint_names(plan))
    assert read == {n for n in checkpoint if not n.startswith("model.visual.")}


def shapes_of(tensors):
    return {n: a.shape for n, a in tensors.items()}


def test_layout_errors():
    config, tensors = artifact_tensors(True, np.random.default_rng())
    shapes = shapes_of(tensors)
    missing = dict(shapes)
    del missing["model.layers.0.linear_attn.A_log"]
    with pytest.raises(CheckpointLayoutError, match="lacks tensors.*A_log"):
        plan_qwen3_5_tensors(missing, config)
    extra = dict(shapes, **{"model.layers.3.self_attn.q_proj.weight_scale_inv": (1, 1)})
    with pytest.raises(CheckpointLayoutError, match="unexpected tensors.*weight_scale_inv"):
        plan_qwen3_5_tensors(extra, config)
    wrong = dict(shapes, **{"model.layers.3.self_attn.q_proj.weight": (32, 32)})
    with pytest.raises(
        CheckpointLayoutError, match=r"q_proj.weight: checkpoint gives shape \[32, 32\]"
    ):
        plan_qwen3_5_tensors(wrong, config)
    per_expert = shapes_of(per_expert_names(tensors, MOE["moe_intermediate_size"]))
    incomplete = dict(per_expert)
    del incomplete["model.layers.1.mlp.experts.3.up_proj.weight"]
    with pytest.raises(CheckpointLayoutError, match="per-expert tensors incomplete"):
        plan_qwen3_5_tensors(incomplete, config)
    both = dict(per_expert, **{"model.layers.1.mlp.experts.down_proj": (4, 32, 12)})
    with pytest.raises(CheckpointLayoutError, match="both stacked and per expert"):
        plan_qwen3_5_tensors(both, config)
    duplicate = dict(shapes, **{"model.language_model.norm.weight": (32,)})
    with pytest.raises(CheckpointLayoutError, match="both give model.norm.weight"):
        plan_qwen3_5_tensors(duplicate, config)
