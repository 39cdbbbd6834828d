"""Small Qwen3.5/3.6 configs with the real models' ratios, built in fp32 with transformers,
saved with save_pretrained and converted by the real converter (for parity, engine and bench).

Ratios kept from the releases (spec §1): GQA 6:1 (27B: 24 q / 4 kv heads) and 8:1 (35B-A3B:
16 / 2), DeltaNet value/key head ratio 3 (27B: 48 / 16) and 2 (35B: 32 / 16), dk = dv,
partial rotary factor 1/4, three GDN layers per full-attention layer, θ = 1e7, MoE top-k
renormalised with a sigmoid-gated shared expert. dk = dv = 32 instead of 128: smaller heads
make the chunked delta rule ill-conditioned enough that fp32 rounding alone moves logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ninfer.convert import convert_source
from ninfer.convert.synthetic_tokenizer import synthetic_tokenizer_json

VOCAB = 384  # covers the synthetic tokenizer's ids
PATTERN = ["linear_attention"] * 3 + ["full_attention"]
ROPE = dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25)

DENSE = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
    layer_types=PATTERN * 2, num_attention_heads=6, num_key_value_heads=1, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32,
    linear_value_head_dim=32, linear_conv_kernel_dim=4, rope_parameters=ROPE,
    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
    initializer_range=0.15,
)
MOE = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, layer_types=PATTERN,
    num_attention_heads=8, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, rope_parameters=ROPE, max_position_embeddings=4096,
    rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.15,
)
CONFIGS = {"qwen3_5": DENSE, "qwen3_5_moe": MOE}


def hf_model(architecture: str, seed: int = 0, overrides: dict[str, Any] | None = None) -> Any:
    """A float32 eval-mode Qwen3_5(Moe)ForCausalLM with randomised norms and GDN constants."""
    import torch

    if architecture == "qwen3_5":
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig as cfg
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as cls
    else:
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (
            Qwen3_5MoeTextConfig as cfg,
        )
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
            Qwen3_5MoeForCausalLM as cls,
        )
    torch.manual_seed(seed)
    # Eager experts: transformers' grouped_mm has no float64 path (the f64 reference).
    config = cfg(**(CONFIGS[architecture] | (overrides or {})), experts_implementation="eager",
                 attn_implementation="eager")
    model = cls(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # values that make every norm and gate path matter
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * noise)  # plain gain
            elif name.endswith("norm.weight"):
                p.copy_(0.2 * noise)  # zero-centred (1 + w) gains
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.1, 8.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * noise)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def build_artifact(architecture: str, folder: Path, seed: int = 0,
                   overrides: dict[str, Any] | None = None) -> tuple[Any, Path]:
    """(the transformers model, its converted f32 .ninfer artifact)."""
    model = hf_model(architecture, seed, overrides)
    hf = folder / "hf"
    model.save_pretrained(hf)
    (hf / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    artifact = convert_source(hf, folder / f"{architecture}.ninfer", dtype="f32", progress=False)
    return model, Path(artifact)
