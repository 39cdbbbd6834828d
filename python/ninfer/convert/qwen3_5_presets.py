"""The released Qwen3.6 text-decoder shapes (model spec §1), for random-weight artifacts.

Each preset is a config.json dict in the released multimodal form (decoder under
`text_config`, vision omitted), so it goes through the same normalisation as a downloaded
checkpoint. Qwen3.5-27B / -35B-A3B share these shapes.
"""

from __future__ import annotations

import copy
from typing import Any

_ROPE = {
    "rope_type": "default",
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
    "mrope_interleaved": True,
}

_COMMON_TEXT = {
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "rope_parameters": _ROPE,
    "rms_norm_eps": 1e-6,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "attn_output_gate": True,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "mamba_ssm_dtype": "float32",
    "bos_token_id": 248044,
    "eos_token_id": 248044,
}

_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "text_config": {
            **_COMMON_TEXT,
            "model_type": "qwen3_5_text",
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_hidden_layers": 64,
            "num_attention_heads": 24,
            "num_key_value_heads": 4,
            "linear_num_value_heads": 48,
        },
    },
    "qwen3.6-35b-a3b": {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "text_config": {
            **_COMMON_TEXT,
            "model_type": "qwen3_5_moe_text",
            "hidden_size": 2048,
            "num_hidden_layers": 40,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "linear_num_value_heads": 32,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "router_aux_loss_coef": 0.001,
        },
    },
}

# generation_config.json of the releases (sampling defaults and stop ids) [spec §1.1, 3P].
QWEN3_6_GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": 248044,
    "eos_token_id": [248046, 248044],
    "pad_token_id": 248044,
    "do_sample": True,
    "temperature": 1.0,
    "top_k": 20,
    "top_p": 0.95,
}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def qwen3_5_preset(name: str) -> dict[str, Any]:
    """A fresh copy of the named preset's config.json (e.g. "qwen3.6-27b")."""
    key = name.lower()
    if key not in _PRESETS:
        raise KeyError(f"unknown Qwen3.5/3.6 preset {name!r}; known: {', '.join(preset_names())}")
    return copy.deepcopy(_PRESETS[key])
