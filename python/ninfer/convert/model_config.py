"""The normalized model config stored in the artifact header, and the tensor set it implies.

Every converter (HF folder, GGUF, random) funnels through `normalize_config` and
`expected_tensors`, so all artifacts of one architecture have the same keys and names.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


class UnsupportedModelError(ValueError):
    """The source describes a model this converter cannot represent faithfully."""


def architecture_of(hf_config: dict[str, Any]) -> str:
    for name in hf_config.get("architectures") or []:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    model_type = hf_config.get("model_type")
    if model_type in MODEL_TYPES and not hf_config.get("architectures"):
        return MODEL_TYPES[model_type]
    found = hf_config.get("architectures") or model_type
    raise UnsupportedModelError(
        f"unsupported architecture {found!r}; supported: {', '.join(ARCHITECTURES)}"
    )


def _rope(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from the classic keys or transformers 5 `rope_parameters`."""
    params = dict(hf_config.get("rope_parameters") or {})
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = hf_config.get("rope_theta", 10000.0)
    scaling = hf_config.get("rope_scaling") or (params or None)
    if scaling is not None:
        scaling = dict(scaling)
        scaling.pop("rope_theta", None)
        if "rope_type" not in scaling and "type" in scaling:
            scaling["rope_type"] = scaling.pop("type")
        if scaling.get("rope_type", "default") == "default":
            scaling = None
    return float(theta), scaling


def normalize_config(architecture: str, hf_config: dict[str, Any]) -> dict[str, Any]:
    """HF-style config with every key the engine reads present and explicit."""
    required = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    )
    missing = [key for key in required if hf_config.get(key) is None]
    if missing:
        raise UnsupportedModelError(f"config lacks {', '.join(missing)}")
    heads = int(hf_config["num_attention_heads"])
    hidden = int(hf_config["hidden_size"])
    kv_heads = int(hf_config.get("num_key_value_heads") or heads)
    head_dim = hf_config.get("head_dim") or hidden // heads
    if heads % kv_heads:
        raise UnsupportedModelError(f"{heads} attention heads not divisible by {kv_heads} KV heads")
    if hf_config.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    if hf_config.get("use_sliding_window"):
        raise UnsupportedModelError("sliding-window attention is not supported")
    act = hf_config.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only silu)")
    if architecture == "qwen2":
        attention_bias = True  # Qwen2 always has q/k/v biases and no o_proj bias
    elif hf_config.get("attention_bias"):
        # Llama/Qwen3 attention_bias also adds an o_proj bias, which the artifact has no slot for.
        raise UnsupportedModelError(f"{architecture} with attention_bias=true is not supported")
    else:
        attention_bias = False
    rope_theta, rope_scaling = _rope(hf_config)
    return {
        "hidden_size": hidden,
        "intermediate_size": int(hf_config["intermediate_size"]),
        "num_hidden_layers": int(hf_config["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": int(head_dim),
        "vocab_size": int(hf_config["vocab_size"]),
        "rms_norm_eps": float(hf_config.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(hf_config.get("max_position_embeddings") or 4096),
        "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", False)),
        "attention_bias": attention_bias,
        "qk_norm": architecture == "qwen3",
    }


def expected_tensors(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes ([out, in] for weights) of a normalized config, in layer order."""
    d, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "self_attn.q_proj.weight"] = (q, d)
        shapes[p + "self_attn.k_proj.weight"] = (kv, d)
        shapes[p + "self_attn.v_proj.weight"] = (kv, d)
        if config["attention_bias"]:
            shapes[p + "self_attn.q_proj.bias"] = (q,)
            shapes[p + "self_attn.k_proj.bias"] = (kv,)
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        if config["qk_norm"]:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "self_attn.o_proj.weight"] = (d, q)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (ff, d)
        shapes[p + "mlp.up_proj.weight"] = (ff, d)
        shapes[p + "mlp.down_proj.weight"] = (d, ff)
    shapes["model.norm.weight"] = (d,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, d)
    return shapes
