"""Normalized config and tensor set of Qwen3.5/3.6 hybrid models (`qwen3_5`, `qwen3_5_moe`).

The released checkpoints are multimodal: config.json nests the decoder under `text_config`
next to `vision_config`. The artifact stores the text decoder only, so the config is flattened
to one HF-style dict with every key the engine reads present and explicit (model spec §1, §5):
the common keys of every architecture plus the GDN, gated-attention, MoE and MTP fields.
Missing fields take the defaults of transformers' Qwen3_5TextConfig / Qwen3_5MoeTextConfig.
"""

from __future__ import annotations

from typing import Any

HYBRID_ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
}
HYBRID_MODEL_TYPES = {
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
}
LAYER_TYPES = ("linear_attention", "full_attention")

# transformers 5.24 defaults for fields a config may omit.
_TEXT_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "full_attention_interval": 4,
    "mtp_num_hidden_layers": 0,
    "mtp_use_dedicated_embeddings": False,
}
_MOE_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 2,
    "linear_num_value_heads": 32,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 8,
    "num_experts": 256,
}
_ROPE_KEYS_NOT_SCALING = {
    "rope_theta",
    "partial_rotary_factor",
    "mrope_section",
    "mrope_interleaved",
}


class UnsupportedQwenConfigError(ValueError):
    """The config is not a Qwen3.5/3.6 text decoder this engine can represent."""


def hybrid_architecture_of(hf_config: dict[str, Any]) -> str | None:
    """'qwen3_5' / 'qwen3_5_moe' for a Qwen3.5/3.6 config, None for any other model."""
    for name in hf_config.get("architectures") or []:
        if name in HYBRID_ARCHITECTURES:
            return HYBRID_ARCHITECTURES[name]
    return HYBRID_MODEL_TYPES.get(hf_config.get("model_type", ""))


def text_config_of(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The decoder's fields: `text_config` over the top level (which supplies only what the
    text config lacks, e.g. tie_word_embeddings in some exports)."""
    text = hf_config.get("text_config")
    if text is None:
        return dict(hf_config)
    if not isinstance(text, dict):
        raise UnsupportedQwenConfigError("text_config must be a JSON object")
    merged = {k: v for k, v in hf_config.items() if k not in ("text_config", "vision_config")}
    merged.update(text)
    return merged


def _rope(text: dict[str, Any], head_dim: int) -> dict[str, Any]:
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    rotary_dim = int(head_dim * float(factor))
    if rotary_dim <= 0 or rotary_dim % 2:
        raise UnsupportedQwenConfigError(
            f"partial_rotary_factor {factor} gives rotary dim {rotary_dim}; it must be even and > 0"
        )
    scaling = {k: v for k, v in params.items() if k not in _ROPE_KEYS_NOT_SCALING}
    if "rope_type" not in scaling and "type" in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        scaling = None
    return {
        "rope_theta": float(theta),
        "rope_scaling": scaling,
        "partial_rotary_factor": float(factor),
        "rotary_dim": rotary_dim,
        "mrope_section": list(params.get("mrope_section") or [11, 11, 10]),
        "mrope_interleaved": bool(params.get("mrope_interleaved", True)),
    }


def _layer_types(text: dict[str, Any], layers: int) -> list[str]:
    types = text.get("layer_types")
    if types is None:
        interval = int(text.get("full_attention_interval") or 4)
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ]
    types = list(types)
    if len(types) != layers:
        raise UnsupportedQwenConfigError(
            f"layer_types has {len(types)} entries for {layers} hidden layers"
        )
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise UnsupportedQwenConfigError(f"unknown layer types {unknown}; known: {LAYER_TYPES}")
    return types


def normalize_qwen3_5_config(architecture: str, hf_config: dict[str, Any]) -> dict[str, Any]:
    """Flattened, explicit config of a `qwen3_5` or `qwen3_5_moe` text decoder."""
    if architecture not in ("qwen3_5", "qwen3_5_moe"):
        raise UnsupportedQwenConfigError(f"not a Qwen3.5/3.6 architecture: {architecture!r}")
    moe = architecture == "qwen3_5_moe"
    text = {**_TEXT_DEFAULTS, **(_MOE_DEFAULTS if moe else {}), **text_config_of(hf_config)}
    required = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
    if not moe:
        required.append("intermediate_size")
    missing = [key for key in required if text.get(key) is None]
    if missing:
        raise UnsupportedQwenConfigError(f"config lacks {', '.join(missing)}")
    if text["hidden_act"] != "silu":
        raise UnsupportedQwenConfigError(f"hidden_act {text['hidden_act']!r} is not supported")
    if text["attention_bias"]:
        raise UnsupportedQwenConfigError("attention_bias=true is not supported for Qwen3.5")
    heads, kv_heads = int(text["num_attention_heads"]), int(text["num_key_value_heads"])
    if heads % kv_heads:
        raise UnsupportedQwenConfigError(f"{heads} attention heads not divisible by {kv_heads}")
    key_heads, value_heads = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
    if value_heads % key_heads:
        raise UnsupportedQwenConfigError(
            f"linear_num_value_heads {value_heads} is not a multiple of "
            f"linear_num_key_heads {key_heads}"
        )
    layers = int(text["num_hidden_layers"])
    head_dim = int(text["head_dim"])
    config: dict[str, Any] = {
        "hidden_size": int(text["hidden_size"]),
        # MoE models have no dense MLP; 0 says so explicitly (every layer is sparse).
        "intermediate_size": 0 if moe else int(text["intermediate_size"]),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": int(text["vocab_size"]),
        "rms_norm_eps": float(text["rms_norm_eps"]),
        "max_position_embeddings": int(text["max_position_embeddings"]),
        "tie_word_embeddings": bool(text["tie_word_embeddings"]),
        "attention_bias": False,
        "qk_norm": True,
        "attn_output_gate": True,
        "layer_types": _layer_types(text, layers),
        "linear_num_key_heads": key_heads,
        "linear_num_value_heads": value_heads,
        "linear_key_head_dim": int(text["linear_key_head_dim"]),
        "linear_value_head_dim": int(text["linear_value_head_dim"]),
        "linear_conv_kernel_dim": int(text["linear_conv_kernel_dim"]),
        "mtp_num_hidden_layers": int(text["mtp_num_hidden_layers"]),
        "mtp_use_dedicated_embeddings": bool(text["mtp_use_dedicated_embeddings"]),
        **_rope(text, head_dim),
    }
    if config["mtp_use_dedicated_embeddings"]:
        raise UnsupportedQwenConfigError("mtp_use_dedicated_embeddings=true is not supported")
    if moe:
        experts, top_k = int(text["num_experts"]), int(text["num_experts_per_tok"])
        if not 1 <= top_k <= experts:
            raise UnsupportedQwenConfigError(f"num_experts_per_tok {top_k} not in [1, {experts}]")
        config.update(
            num_experts=experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=int(text["moe_intermediate_size"]),
            shared_expert_intermediate_size=int(text["shared_expert_intermediate_size"]),
            norm_topk_prob=True,  # HF always renormalises the top-k weights (spec §1.2)
        )
    return config


def _attention_shapes(prefix: str, c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    d, hd = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    return {
        prefix + "self_attn.q_proj.weight": (2 * q, d),  # per head: [query | gate]
        prefix + "self_attn.k_proj.weight": (kv, d),
        prefix + "self_attn.v_proj.weight": (kv, d),
        prefix + "self_attn.o_proj.weight": (d, q),
        prefix + "self_attn.q_norm.weight": (hd,),
        prefix + "self_attn.k_norm.weight": (hd,),
    }


def _mlp_shapes(prefix: str, c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    d = c["hidden_size"]
    if "num_experts" not in c:
        ff = c["intermediate_size"]
        return {
            prefix + "mlp.gate_proj.weight": (ff, d),
            prefix + "mlp.up_proj.weight": (ff, d),
            prefix + "mlp.down_proj.weight": (d, ff),
        }
    e, ff, sff = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    return {
        prefix + "mlp.gate.weight": (e, d),
        prefix + "mlp.experts.gate_up_proj": (e, 2 * ff, d),  # stacked: rows [gate | up]
        prefix + "mlp.experts.down_proj": (e, d, ff),
        prefix + "mlp.shared_expert.gate_proj.weight": (sff, d),
        prefix + "mlp.shared_expert.up_proj.weight": (sff, d),
        prefix + "mlp.shared_expert.down_proj.weight": (d, sff),
        prefix + "mlp.shared_expert_gate.weight": (1, d),
    }


def qwen3_5_expected_tensors(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Artifact tensor names and shapes (text-only HF names, `model.` prefix; MoE experts in
    the stacked form; MTP under `mtp.`) of a normalized config, in layer order."""
    d, vocab = config["hidden_size"], config["vocab_size"]
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_width = hk * config["linear_key_head_dim"]
    value_width = hv * config["linear_value_head_dim"]
    conv = 2 * key_width + value_width
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d)}
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        if kind == "linear_attention":
            la = p + "linear_attn."
            shapes[la + "in_proj_qkv.weight"] = (conv, d)
            shapes[la + "in_proj_z.weight"] = (value_width, d)
            shapes[la + "in_proj_b.weight"] = (hv, d)
            shapes[la + "in_proj_a.weight"] = (hv, d)
            shapes[la + "conv1d.weight"] = (conv, 1, config["linear_conv_kernel_dim"])
            shapes[la + "A_log"] = (hv,)
            shapes[la + "dt_bias"] = (hv,)
            shapes[la + "norm.weight"] = (config["linear_value_head_dim"],)
            shapes[la + "out_proj.weight"] = (d, value_width)
        else:
            shapes.update(_attention_shapes(p, config))
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes.update(_mlp_shapes(p, config))
    shapes["model.norm.weight"] = (d,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, d)
    for m in range(config["mtp_num_hidden_layers"]):
        p = f"mtp.layers.{m}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes.update(_attention_shapes(p, config))
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes.update(_mlp_shapes(p, config))
    if config["mtp_num_hidden_layers"]:
        shapes["mtp.fc.weight"] = (d, 2 * d)
        shapes["mtp.pre_fc_norm_embedding.weight"] = (d,)
        shapes["mtp.pre_fc_norm_hidden.weight"] = (d,)
        shapes["mtp.norm.weight"] = (d,)
    return shapes
