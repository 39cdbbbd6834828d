"""The float64 MTP-head reference (qwen3_5_reference.py) checked against transformers' pieces.

HF has no MTP module, so the reference's decoder layer is compared with HF's full-attention
Qwen3_5(Moe)DecoderLayer, and the MTP glue (pre-fc norms, fc over [embedding | hidden],
mtp.norm, shared lm_head) with the same math assembled from HF modules.
"""

from __future__ import annotations

import secrets

import pytest
import torch

import qwen3_5_reference as ref
from ninfer.convert.qwen3_5_config import normalize_qwen3_5_config

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
qwen3_5_moe = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(secrets.randbits(31))


FIELDS = dict(
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    vocab_size=97,
    mtp_num_hidden_layers=1,
    rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
)
MOE_FIELDS = dict(
    num_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=20,
)


def configs(moe: bool):
    fields = dict(FIELDS, **(MOE_FIELDS if moe else {}))
    ours = normalize_qwen3_5_config("qwen3_5_moe" if moe else "qwen3_5", fields)
    hf_fields = {k: v for k, v in fields.items() if k != "mtp_num_hidden_layers"}
    if moe:
        del hf_fields["intermediate_size"]
        hf = qwen3_5_moe.Qwen3_5MoeTextConfig(**hf_fields, layer_types=["full_attention"] * 4)
    else:
        hf = qwen3_5.Qwen3_5TextConfig(**hf_fields, layer_types=["full_attention"] * 4)
    hf._attn_implementation = "eager"
    return ours, hf


def hf_layer(hf_config, moe: bool, weights: ref.Weights, prefix: str):
    cls = qwen3_5_moe.Qwen3_5MoeDecoderLayer if moe else qwen3_5.Qwen3_5DecoderLayer
    layer = cls(hf_config, layer_idx=0).double().eval()
    state = {name[len(prefix) :]: t for name, t in weights.items() if name.startswith(prefix)}
    layer.load_state_dict(state, strict=True)
    return layer


def hf_layer_forward(layer, hf_config, x: torch.Tensor, positions: torch.Tensor):
    rotary = qwen3_5.Qwen3_5TextRotaryEmbedding(hf_config)
    cos, sin = rotary(x[None], positions[None])
    tokens = x.shape[0]
    mask = torch.full((tokens, tokens), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        return layer(x[None], position_embeddings=(cos, sin), attention_mask=mask)[0]


@pytest.mark.parametrize("moe", [False, True])
def test_reference_decoder_layer_matches_hf(gen, moe):
    config, hf_config = configs(moe)
    weights = ref.random_mtp_weights(config, gen)
    layer = hf_layer(hf_config, moe, weights, "mtp.layers.0.")
    x = torch.randn(20, config["hidden_size"], generator=gen, dtype=torch.float64)
    positions = torch.arange(5, 25)
    expected = hf_layer_forward(layer, hf_config, x, positions)
    got = ref.attention_decoder_layer(x, weights, "mtp.layers.0.", config, positions, ref.KvCache())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("moe", [False, True])
def test_mtp_forward_matches_hf_assembled_head(gen, moe):
    config, hf_config = configs(moe)
    weights = ref.random_mtp_weights(config, gen)
    layer = hf_layer(hf_config, moe, weights, "mtp.layers.0.")
    d, eps = config["hidden_size"], config["rms_norm_eps"]

    def hf_norm(name):
        norm = qwen3_5.Qwen3_5RMSNorm(d, eps=eps).double()
        norm.weight.data.copy_(weights[name])
        return norm

    tokens = torch.randint(0, config["vocab_size"], (12,), generator=gen)
    hidden = torch.randn(12, d, generator=gen, dtype=torch.float64)
    positions = torch.arange(12)
    with torch.no_grad():
        e = hf_norm("mtp.pre_fc_norm_embedding.weight")(
            weights["model.embed_tokens.weight"][tokens]
        )
        h = hf_norm("mtp.pre_fc_norm_hidden.weight")(hidden)
        u = torch.nn.functional.linear(torch.cat([e, h], -1), weights["mtp.fc.weight"])
        u = hf_layer_forward(layer, hf_config, u, positions)
        normed = hf_norm("mtp.norm.weight")(u)
        expected_logits = torch.nn.functional.linear(normed, weights["lm_head.weight"])
    logits, out_hidden = ref.mtp_forward(weights, config, hidden, tokens, positions, ref.KvCache())
    torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_hidden, normed, rtol=1e-5, atol=1e-5)
    # The concat order matters: swapping embedding and hidden must change the result.
    swapped = dict(weights)
    swapped["mtp.fc.weight"] = torch.cat(
        [weights["mtp.fc.weight"][:, d:], weights["mtp.fc.weight"][:, :d]], dim=1
    )
    other, _ = ref.mtp_forward(swapped, config, hidden, tokens, positions, ref.KvCache())
    assert not torch.allclose(other, logits, atol=1e-3)


def test_mtp_cache_incremental_equals_one_shot(gen):
    config, _ = configs(False)
    weights = ref.random_mtp_weights(config, gen)
    tokens = torch.randint(0, config["vocab_size"], (10,), generator=gen)
    hidden = torch.randn(10, config["hidden_size"], generator=gen, dtype=torch.float64)
    positions = torch.arange(10)
    whole, _ = ref.mtp_forward(weights, config, hidden, tokens, positions, ref.KvCache())
    cache, parts = ref.KvCache(), []
    for start, end in [(0, 4), (4, 5), (5, 10)]:
        logits, _ = ref.mtp_forward(
            weights, config, hidden[start:end], tokens[start:end], positions[start:end], cache
        )
        parts.append(logits)
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-10, atol=1e-10)


def test_greedy_draft_feeds_back_hidden_and_token(gen):
    config, _ = configs(False)
    weights = ref.random_mtp_weights(config, gen, scale=0.5)
    prefix_hidden = torch.randn(6, config["hidden_size"], generator=gen, dtype=torch.float64)
    prefix_tokens = torch.randint(0, config["vocab_size"], (6,), generator=gen)
    cache = ref.KvCache()
    ref.mtp_forward(weights, config, prefix_hidden[:5], prefix_tokens[1:], torch.arange(5), cache)
    drafts = ref.mtp_greedy_draft(
        weights, config, prefix_hidden[5], int(prefix_tokens[5]), 5, cache, k=3
    )
    # Recompute step by step by hand with a copy of the cache state.
    manual_cache = ref.KvCache()
    ref.mtp_forward(
        weights, config, prefix_hidden[:5], prefix_tokens[1:], torch.arange(5), manual_cache
    )
    hidden, token, expected = prefix_hidden[5:6], int(prefix_tokens[5]), []
    for step in range(3):
        logits, hidden = ref.mtp_forward(
            weights, config, hidden, torch.tensor([token]), torch.tensor([5 + step]), manual_cache
        )
        token = int(logits[0].argmax())
        expected.append(token)
    assert drafts == expected
    assert len(cache.keys) == 1 + 3  # the prefix call plus one entry per draft step
