"""Between Qwen3.5/3.6 artifacts and transformers models, for converter and parity tests.

`hf_text_config` turns an artifact header's normalized config back into transformers'
Qwen3_5TextConfig / Qwen3_5MoeTextConfig; `hf_model_from_artifact` builds the text-only
`Qwen3_5(Moe)ForCausalLM` with the artifact's weights (as float32; MTP tensors, which
transformers has no module for, are returned separately).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact import read_header

_SHARED_KEYS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
    "layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim",
)
_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "shared_expert_intermediate_size")


def hf_text_config(architecture: str, config: dict[str, Any]) -> Any:
    if architecture == "qwen3_5":
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig as cls
    else:
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (
            Qwen3_5MoeTextConfig as cls,
        )
    rope = {"rope_type": "default", **(config["rope_scaling"] or {}),
            "rope_theta": config["rope_theta"],
            "partial_rotary_factor": config["partial_rotary_factor"],
            "mrope_section": config["mrope_section"],
            "mrope_interleaved": config["mrope_interleaved"]}
    fields = {key: config[key] for key in _SHARED_KEYS}
    if architecture == "qwen3_5":
        fields["intermediate_size"] = config["intermediate_size"]
    else:
        fields.update({key: config[key] for key in _MOE_KEYS})
    return cls(**fields, rope_parameters=rope)


def artifact_state_dict(path: str | Path) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(architecture, header config, every tensor decoded to float32)."""
    header = read_header(path)
    tensors = {name: header.tensor_f32(name) for name in header.tensors}
    return header.architecture, header.config, tensors


def hf_model_from_artifact(path: str | Path) -> tuple[Any, dict[str, np.ndarray]]:
    """(float32 transformers model holding the artifact's weights, the MTP tensors)."""
    import torch

    architecture, config, tensors = artifact_state_dict(path)
    if architecture == "qwen3_5":
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as cls
    else:
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
            Qwen3_5MoeForCausalLM as cls,
        )
    model = cls(hf_text_config(architecture, config)).float().eval()
    main = {n: torch.from_numpy(a.copy()) for n, a in tensors.items() if not n.startswith("mtp.")}
    if config["tie_word_embeddings"]:
        main["lm_head.weight"] = main["model.embed_tokens.weight"]
    model.load_state_dict(main, strict=True)
    return model, {n: a for n, a in tensors.items() if n.startswith("mtp.")}
