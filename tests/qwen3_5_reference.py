"""Float64 torch reference of the Qwen3.5/3.6 MTP head (model spec §4), written from the spec.

Transformers ignores `mtp.*` weights, so the MTP draft head has no upstream reference; this one
is built from the same pieces as the main model (spec §2: (1+w) RMSNorm, gated attention with
per-head [query | gate] split, q/k norm, partial NeoX RoPE, GQA, sigmoid gate; dense SwiGLU or
softmax-top-k MoE with a sigmoid-gated shared expert) and is itself tested against transformers'
decoder layers. `config` is a normalized config (ninfer.convert.qwen3_5_config); `weights` maps
HF names to float64 tensors: `mtp.*`, plus the shared `model.embed_tokens.weight` and
`lm_head.weight` (or the embedding when tie_word_embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ninfer.convert.qwen3_5_config import qwen3_5_expected_tensors

Weights = dict[str, torch.Tensor]


def rms_norm_one_plus(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


def rope_neox_partial(x: torch.Tensor, positions: torch.Tensor, config: dict[str, Any]):
    """x [T, heads, head_dim]: rotate the first rotary_dim features, pairing j with j + half."""
    rotary = config["rotary_dim"]
    half = rotary // 2
    inv_freq = 1.0 / config["rope_theta"] ** (
        torch.arange(0, rotary, 2, dtype=torch.float64) / rotary
    )
    angles = positions.to(torch.float64)[:, None] * inv_freq[None]  # [T, half]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    lo, hi = x[..., :half], x[..., half:rotary]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin, x[..., rotary:]], dim=-1)


@dataclass
class KvCache:
    """Keys (normed, rotated) and values of one attention layer, [tokens, kv_heads, head_dim]."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.append(k)
        self.values.append(v)
        return torch.cat(self.keys), torch.cat(self.values)


def gated_attention(
    x: torch.Tensor,
    w: Weights,
    prefix: str,
    config: dict[str, Any],
    positions: torch.Tensor,
    cache: KvCache,
) -> torch.Tensor:
    tokens = x.shape[0]
    heads, kv_heads, hd = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    eps = config["rms_norm_eps"]
    qg = (x @ w[prefix + "q_proj.weight"].T).view(tokens, heads, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(tokens, heads * hd)
    k = (x @ w[prefix + "k_proj.weight"].T).view(tokens, kv_heads, hd)
    v = (x @ w[prefix + "v_proj.weight"].T).view(tokens, kv_heads, hd)
    q = rope_neox_partial(rms_norm_one_plus(q, w[prefix + "q_norm.weight"], eps), positions, config)
    k = rope_neox_partial(rms_norm_one_plus(k, w[prefix + "k_norm.weight"], eps), positions, config)
    keys, values = cache.extend(k, v)
    past = keys.shape[0] - tokens
    group = heads // kv_heads
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->hts", q, keys) / hd**0.5
    allowed = torch.arange(keys.shape[0])[None, :] <= (past + torch.arange(tokens))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("hts,shd->thd", scores.softmax(-1), values).reshape(tokens, heads * hd)
    return (out * gate.sigmoid()) @ w[prefix + "o_proj.weight"].T


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def mlp(x: torch.Tensor, w: Weights, prefix: str, config: dict[str, Any]) -> torch.Tensor:
    if "num_experts" not in config:
        return swiglu(
            x,
            w[prefix + "gate_proj.weight"],
            w[prefix + "up_proj.weight"],
            w[prefix + "down_proj.weight"],
        )
    ff = config["moe_intermediate_size"]
    probs = (x @ w[prefix + "gate.weight"].T).softmax(-1)
    top_w, top_ids = probs.topk(config["num_experts_per_tok"], dim=-1)
    top_w = top_w / top_w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    gate_up, down = w[prefix + "experts.gate_up_proj"], w[prefix + "experts.down_proj"]
    for t in range(x.shape[0]):
        for weight, e in zip(top_w[t], top_ids[t].tolist(), strict=True):
            out[t] += weight * swiglu(x[t : t + 1], gate_up[e, :ff], gate_up[e, ff:], down[e])[0]
    s = prefix + "shared_expert."
    shared = swiglu(
        x, w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"]
    )
    return out + (x @ w[prefix + "shared_expert_gate.weight"].T).sigmoid() * shared


def attention_decoder_layer(x, w: Weights, prefix: str, config, positions, cache: KvCache):
    """One full-attention decoder layer: pre-norm gated attention, then pre-norm MLP/MoE."""
    eps = config["rms_norm_eps"]
    h = rms_norm_one_plus(x, w[prefix + "input_layernorm.weight"], eps)
    x = x + gated_attention(h, w, prefix + "self_attn.", config, positions, cache)
    h = rms_norm_one_plus(x, w[prefix + "post_attention_layernorm.weight"], eps)
    return x + mlp(h, w, prefix + "mlp.", config)


def lm_head(w: Weights, config: dict[str, Any]) -> torch.Tensor:
    return w["model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"]


def mtp_forward(
    w: Weights,
    config: dict[str, Any],
    hidden_prev: torch.Tensor,
    next_tokens: torch.Tensor,
    positions: torch.Tensor,
    cache: KvCache,
    step: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots i = 0..T-1: hidden_prev[i] (the main model's final-normed hidden at positions[i])
    with the embedding of next_tokens[i] (the token after it). Returns (logits [T, vocab] of
    the token after next, hidden [T, H] after mtp.norm: the h_prev of a further draft step)."""
    eps = config["rms_norm_eps"]
    e = rms_norm_one_plus(
        w["model.embed_tokens.weight"][next_tokens], w["mtp.pre_fc_norm_embedding.weight"], eps
    )
    h = rms_norm_one_plus(hidden_prev, w["mtp.pre_fc_norm_hidden.weight"], eps)
    u = torch.cat([e, h], dim=-1) @ w["mtp.fc.weight"].T  # the embedding comes first
    layer = f"mtp.layers.{step % config['mtp_num_hidden_layers']}."
    u = attention_decoder_layer(u, w, layer, config, positions, cache)
    normed = rms_norm_one_plus(u, w["mtp.norm.weight"], eps)
    return normed @ lm_head(w, config).T, normed


def mtp_greedy_draft(
    w: Weights,
    config: dict[str, Any],
    hidden_last: torch.Tensor,
    sampled_token: int,
    position: int,
    cache: KvCache,
    k: int,
) -> list[int]:
    """k greedy draft tokens after the main model sampled `sampled_token` from the hidden
    `hidden_last` [H] at `position`: each step feeds back the MTP's own normed hidden and draft,
    at the next position (spec §4.2)."""
    drafts: list[int] = []
    hidden, token = hidden_last[None], sampled_token
    for step in range(k):
        logits, hidden = mtp_forward(
            w, config, hidden, torch.tensor([token]), torch.tensor([position + step]), cache, step
        )
        token = int(logits[0].argmax())
        drafts.append(token)
    return drafts


def random_mtp_weights(config: dict[str, Any], gen: torch.Generator, scale: float = 0.2) -> Weights:
    """Random float64 weights for the MTP head and the shared embedding / lm_head."""
    shapes = qwen3_5_expected_tensors(config)
    names = [n for n in shapes if n.startswith("mtp.")]
    names += ["model.embed_tokens.weight"]
    if not config["tie_word_embeddings"]:
        names.append("lm_head.weight")
    weights = {}
    for name in names:
        weights[name] = torch.randn(shapes[name], generator=gen, dtype=torch.float64) * scale
    return weights
