"""Qwen3.5/3.6 hybrid-layer CPU kernels (`_core.hybrid`) against float64 torch references.

The references follow the model spec (../shared/reference/qwen3_5-model-spec.md §2-§3) and
transformers' qwen3_5 torch implementation, which is also called directly where it exists.
Every test draws fresh random inputs; the seed is part of each failure message.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
import torch
import torch.nn.functional as F

hybrid = pytest.importorskip("ninfer._core").hybrid
qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
qwen3_5_moe = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")


@pytest.fixture
def gen() -> torch.Generator:
    seed = secrets.randbits(31)
    return torch.Generator().manual_seed(seed)


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).contiguous().numpy()


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a)).to(torch.float64)


def assert_close(actual, expected, gen, rtol=1e-4, atol=1e-5, what=""):
    torch.testing.assert_close(
        t64(actual) if isinstance(actual, np.ndarray) else actual.to(torch.float64),
        expected.to(torch.float64),
        rtol=rtol,
        atol=atol,
        msg=lambda m: f"{what} (seed {gen.initial_seed()}): {m}",
    )


# ---------------------------------------------------------------------------------------------
# float64 references written from the spec


def delta_rule_reference(q, k, v, g, beta, state):
    """Token-by-token gated delta rule in float64 (spec §2.4 step 7).

    q, k [T, Hk, dk] (already normalised / scaled), v [T, Hv, dv], g, beta [T, Hv],
    state [Hv, dk, dv]. Returns (out [T, Hv, dv], final state, states after each token).
    """
    ratio = v.shape[1] // k.shape[1]
    q = q.repeat_interleave(ratio, dim=1)
    k = k.repeat_interleave(ratio, dim=1)
    s = state.clone()
    outs, history = [], []
    for t in range(q.shape[0]):
        s = s * g[t].exp()[:, None, None]
        memory = torch.einsum("hij,hi->hj", s, k[t])
        delta = beta[t][:, None] * (v[t] - memory)
        s = s + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hij,hi->hj", s, q[t]))
        history.append(s.clone())
    return torch.stack(outs), s, torch.stack(history)


def delta_rule_inputs(gen, tokens, hk, hv, dk, dv, decay_scale=1.0):
    q = qwen3_5.l2norm(randn(gen, tokens, hk, dk)) * dk**-0.5
    k = qwen3_5.l2norm(randn(gen, tokens, hk, dk))
    v = randn(gen, tokens, hv, dv)
    g = -torch.rand(tokens, hv, generator=gen, dtype=torch.float64) * decay_scale
    beta = torch.rand(tokens, hv, generator=gen, dtype=torch.float64)
    state = randn(gen, hv, dk, dv, scale=0.5)
    return q, k, v, g, beta, state


HEAD_SHAPES = [(2, 2, 16, 16), (2, 4, 16, 8), (2, 6, 32, 16)]  # ratios 1, 2 (35B), 3 (27B)


# ---------------------------------------------------------------------------------------------
# causal conv1d


@pytest.mark.parametrize("threads", [1, 2])
def test_conv1d_fresh_sequence_matches_hf(gen, threads):
    tokens, channels, kernel = 150, 96, 4
    x, w = randn(gen, tokens, channels), randn(gen, channels, kernel, scale=0.5)
    expected = qwen3_5.causal_conv1d_fn(x.T[None], w, None, activation="silu")[0].T
    out, state = hybrid.causal_conv1d_silu(
        f32(x), f32(w), np.zeros((kernel - 1, channels), np.float32), threads=threads
    )
    assert_close(out, expected, gen, what="conv output")
    np.testing.assert_array_equal(state, f32(x[-(kernel - 1) :]))


def test_conv1d_with_state_matches_hf_update(gen):
    tokens, channels, kernel = 5, 40, 4
    x, w = randn(gen, tokens, channels), randn(gen, channels, kernel)
    prior = randn(gen, kernel - 1, channels)
    hf_state = prior.T[None].clone()  # HF keeps the window channel-major
    expected = qwen3_5.causal_conv1d_update(x.T[None], hf_state, w, None, activation="silu")[0].T
    out, state = hybrid.causal_conv1d_silu(f32(x), f32(w), f32(prior))
    assert_close(out, expected, gen, what="conv output")
    np.testing.assert_array_equal(state, f32(hf_state[0].T))


@pytest.mark.parametrize("pieces", [[1, 63, 64, 65], [2, 1, 1, 3], [200]])
def test_conv1d_state_carry_equals_one_shot(gen, pieces):
    channels, kernel = 70, 4
    x, w = randn(gen, sum(pieces), channels), randn(gen, channels, kernel)
    whole, whole_state = hybrid.causal_conv1d_silu(
        f32(x), f32(w), np.zeros((kernel - 1, channels), np.float32)
    )
    state, outs, start = np.zeros((kernel - 1, channels), np.float32), [], 0
    for n in pieces:
        out, state = hybrid.causal_conv1d_silu(f32(x[start : start + n]), f32(w), state)
        outs.append(out)
        start += n
    np.testing.assert_array_equal(np.concatenate(outs), whole)
    np.testing.assert_array_equal(state, whole_state)


def test_conv1d_rejects_bad_shapes():
    with pytest.raises(ValueError, match="conv_state"):
        hybrid.causal_conv1d_silu(
            np.zeros((3, 8), np.float32), np.zeros((8, 4), np.float32), np.zeros((4, 8), np.float32)
        )


# ---------------------------------------------------------------------------------------------
# q/k normalisation and gates


def test_l2norm_heads_with_query_scale(gen):
    x = randn(gen, 7, 3, 32, scale=3.0)
    scale = 32**-0.5
    out = hybrid.l2norm_heads(f32(x), scale)
    assert_close(out, qwen3_5.l2norm(x) * scale, gen, what="l2norm")


def test_gdn_gates(gen):
    tokens, heads = 9, 6
    b, a = randn(gen, tokens, heads, scale=3), randn(gen, tokens, heads, scale=10)
    a[0, 0] = 25.0  # above softplus' threshold of 20
    A_log, dt_bias = randn(gen, heads), randn(gen, heads)
    beta, g = hybrid.gdn_gates(f32(b), f32(a), f32(A_log), f32(dt_bias))
    assert_close(beta, b.sigmoid(), gen, what="beta")
    assert_close(g, -A_log.exp() * F.softplus(a + dt_bias), gen, what="g")
    assert (g <= 0).all()


# ---------------------------------------------------------------------------------------------
# gated delta rule


@pytest.mark.parametrize("shape", HEAD_SHAPES)
def test_recurrent_matches_float64_reference(gen, shape):
    q, k, v, g, beta, state = delta_rule_inputs(gen, 20, *shape)
    ref_out, ref_state, ref_hist = delta_rule_reference(q, k, v, g, beta, state)
    out, new_state, hist = hybrid.delta_rule_recurrent(
        f32(q), f32(k), f32(v), f32(g), f32(beta), f32(state), keep_history=True
    )
    assert_close(out, ref_out, gen, what="output")
    assert_close(new_state, ref_state, gen, what="state")
    assert_close(hist, ref_hist, gen, what="per-token states")


@pytest.mark.parametrize("shape", HEAD_SHAPES)
@pytest.mark.parametrize("tokens", [1, 64, 150])
def test_chunked_matches_float64_reference(gen, shape, tokens):
    q, k, v, g, beta, state = delta_rule_inputs(gen, tokens, *shape, decay_scale=0.2)
    ref_out, ref_state, _ = delta_rule_reference(q, k, v, g, beta, state)
    out, new_state = hybrid.delta_rule_chunked(
        f32(q), f32(k), f32(v), f32(g), f32(beta), f32(state)
    )
    assert_close(out, ref_out, gen, rtol=2e-4, atol=5e-5, what="output")
    assert_close(new_state, ref_state, gen, rtol=2e-4, atol=5e-5, what="state")


def test_chunked_survives_strong_decay(gen):
    # exp(G) underflows inside a chunk; the chunked form must stay finite and exact.
    q, k, v, g, beta, state = delta_rule_inputs(gen, 130, 2, 4, 16, 16, decay_scale=30.0)
    ref_out, ref_state, _ = delta_rule_reference(q, k, v, g, beta, state)
    out, new_state = hybrid.delta_rule_chunked(
        f32(q), f32(k), f32(v), f32(g), f32(beta), f32(state)
    )
    assert np.isfinite(out).all() and np.isfinite(new_state).all()
    assert_close(out, ref_out, gen, what="output")
    assert_close(new_state, ref_state, gen, what="state")


def hf_layout(q, k, v, g, beta):
    return [x[None].to(torch.float32) for x in (q, k, v, g, beta)]


@pytest.mark.parametrize("shape", HEAD_SHAPES)
def test_chunked_and_recurrent_match_hf_torch_functions(gen, shape):
    tokens = 150
    hk, hv, dk, dv = shape
    raw_q, raw_k = randn(gen, tokens, hk, dk), randn(gen, tokens, hk, dk)
    _, _, v, g, beta, state = delta_rule_inputs(gen, tokens, *shape, decay_scale=0.2)
    hf_args = hf_layout(raw_q, raw_k, v, g, beta)
    hf_state = state[None].to(torch.float32)
    hf_chunk, hf_chunk_state = qwen3_5.torch_chunk_gated_delta_rule(
        *hf_args, initial_state=hf_state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    hf_rec, hf_rec_state = qwen3_5.torch_recurrent_gated_delta_rule(
        *hf_args, initial_state=hf_state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    q = hybrid.l2norm_heads(f32(raw_q), dk**-0.5)
    k = hybrid.l2norm_heads(f32(raw_k), 1.0)
    args = (q, k, f32(v), f32(g), f32(beta), f32(state))
    out_c, state_c = hybrid.delta_rule_chunked(*args)
    out_r, state_r, _ = hybrid.delta_rule_recurrent(*args)
    tol = dict(rtol=5e-4, atol=1e-4)
    assert_close(out_c, hf_chunk[0], gen, what="chunked vs HF chunked", **tol)
    assert_close(state_c, hf_chunk_state[0], gen, what="chunked state vs HF", **tol)
    assert_close(out_r, hf_rec[0], gen, what="recurrent vs HF recurrent", **tol)
    assert_close(state_r, hf_rec_state[0], gen, what="recurrent state vs HF", **tol)


@pytest.mark.parametrize("threads", [1, 3])
def test_chunked_equals_token_by_token_recurrent(gen, threads):
    q, k, v, g, beta, state = delta_rule_inputs(gen, 150, 2, 6, 16, 16, decay_scale=0.3)
    out_c, state_c = hybrid.delta_rule_chunked(
        f32(q), f32(k), f32(v), f32(g), f32(beta), f32(state), threads=threads
    )
    s, outs = f32(state), []
    for t in range(q.shape[0]):
        one = [f32(x[t : t + 1]) for x in (q, k, v, g, beta)]
        out, s, _ = hybrid.delta_rule_recurrent(*one, s, threads=threads)
        outs.append(out)
    assert_close(out_c, t64(np.concatenate(outs)), gen, what="outputs")
    assert_close(state_c, t64(s), gen, what="final state")


@pytest.mark.parametrize("pieces", [[1, 63, 64, 65], [65, 64, 63, 1], [100, 93]])
def test_chunked_state_carry_across_split_calls(gen, pieces):
    q, k, v, g, beta, state = delta_rule_inputs(gen, sum(pieces), 2, 4, 16, 16, decay_scale=0.3)
    ref_out, ref_state, _ = delta_rule_reference(q, k, v, g, beta, state)
    s, outs, start = f32(state), [], 0
    for n in pieces:
        part = [f32(x[start : start + n]) for x in (q, k, v, g, beta)]
        out, s = hybrid.delta_rule_chunked(*part, s)
        outs.append(out)
        start += n
    assert_close(np.concatenate(outs), ref_out, gen, rtol=2e-4, atol=5e-5, what="outputs")
    assert_close(s, ref_state, gen, rtol=2e-4, atol=5e-5, what="state")


def test_chunk_size_does_not_change_result(gen):
    q, k, v, g, beta, state = delta_rule_inputs(gen, 100, 2, 4, 16, 16, decay_scale=0.3)
    args = [f32(x) for x in (q, k, v, g, beta, state)]
    out64, state64 = hybrid.delta_rule_chunked(*args, chunk_size=64)
    for chunk in (1, 7, 128):
        out, new_state = hybrid.delta_rule_chunked(*args, chunk_size=chunk)
        assert_close(out, t64(out64), gen, what=f"chunk {chunk} output")
        assert_close(new_state, t64(state64), gen, what=f"chunk {chunk} state")


def test_delta_rule_rejects_bad_head_ratio():
    q = np.zeros((2, 4, 8), np.float32)
    v = np.zeros((2, 6, 8), np.float32)
    g = np.zeros((2, 6), np.float32)
    with pytest.raises(ValueError, match="multiple of linear_num_key_heads"):
        hybrid.delta_rule_chunked(q, q, v, g, g, np.zeros((6, 8, 8), np.float32))


# ---------------------------------------------------------------------------------------------
# norms


def test_gated_rmsnorm_matches_hf(gen):
    dv = 32
    norm = qwen3_5.Qwen3_5RMSNormGated(dv, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(1 + randn(gen, dv, scale=0.3))
    x, z = randn(gen, 12, dv, scale=2), randn(gen, 12, dv, scale=2)
    with torch.no_grad():
        expected = norm(x, z)
    out = hybrid.gated_rmsnorm(f32(x), f32(z), f32(norm.weight), 1e-6)
    assert_close(out, expected, gen, what="gated rmsnorm")


def test_zero_centered_rmsnorm_matches_hf(gen):
    dim = 48
    norm = qwen3_5.Qwen3_5RMSNorm(dim, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(randn(gen, dim, scale=0.3))
    x = randn(gen, 10, dim, scale=4)
    with torch.no_grad():
        expected = norm(x)
    out = hybrid.rmsnorm_zero_centered(f32(x), f32(norm.weight), 1e-6)
    assert_close(out, expected, gen, what="(1+w) rmsnorm")
    # and the plain-weight norm would be visibly different: the check above can fail
    plain = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.detach()
    assert not np.allclose(out, plain.numpy(), atol=1e-3)


# ---------------------------------------------------------------------------------------------
# whole GDN layer between its projections, against HF's Qwen3_5GatedDeltaNet


def small_text_config(**overrides):
    fields = dict(
        hidden_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        vocab_size=64,
    )
    fields.update(overrides)
    return qwen3_5.Qwen3_5TextConfig(**fields)


def random_gdn_layer(gen, config):
    layer = qwen3_5.Qwen3_5GatedDeltaNet(config, layer_idx=0).to(torch.float32)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
        layer.A_log.copy_(torch.rand(layer.A_log.shape, generator=gen) * 2 - 1)
        layer.norm.weight.add_(1.0)
    return layer


def run_core(layer, config, x, conv_state, ssm_state, form="auto"):
    with torch.no_grad():
        mixed, z = layer.in_proj_qkv(x), layer.in_proj_z(x)
        b, a = layer.in_proj_b(x), layer.in_proj_a(x)
        out, conv_state, ssm_state = hybrid.gdn_mixer_core(
            f32(mixed),
            f32(z),
            f32(b),
            f32(a),
            f32(layer.conv1d.weight[:, 0]),
            f32(layer.A_log),
            f32(layer.dt_bias),
            f32(layer.norm.weight),
            conv_state,
            ssm_state,
            key_heads=config.linear_num_key_heads,
            key_dim=config.linear_key_head_dim,
            form=form,
            eps=config.rms_norm_eps,
        )
        projected = layer.out_proj(torch.from_numpy(out))
    return projected, conv_state, ssm_state


def zero_states(config):
    channels = 2 * config.linear_num_key_heads * config.linear_key_head_dim + (
        config.linear_num_value_heads * config.linear_value_head_dim
    )
    conv = np.zeros((config.linear_conv_kernel_dim - 1, channels), np.float32)
    ssm = np.zeros(
        (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim),
        np.float32,
    )
    return conv, ssm


@pytest.mark.parametrize("value_heads", [2, 4, 6])
def test_gdn_mixer_core_matches_hf_layer(gen, value_heads):
    config = small_text_config(linear_num_value_heads=value_heads)
    layer = random_gdn_layer(gen, config)
    x = torch.randn(1, 150, config.hidden_size, generator=gen)
    with torch.no_grad():
        expected = layer(x)[0]
    out, _, _ = run_core(layer, config, x[0], *zero_states(config))
    assert_close(out, expected, gen, rtol=1e-3, atol=1e-4, what="GDN layer")


def test_gdn_mixer_core_prefill_pieces_and_decode_equal_one_shot(gen):
    config = small_text_config()
    layer = random_gdn_layer(gen, config)
    x = torch.randn(200, config.hidden_size, generator=gen)
    whole, whole_conv, whole_ssm = run_core(layer, config, x, *zero_states(config))
    conv, ssm = zero_states(config)
    outs, start = [], 0
    for n in [1, 63, 64, 65]:  # chunked prefill pieces
        out, conv, ssm = run_core(layer, config, x[start : start + n], conv, ssm, "chunked")
        outs.append(out)
        start += n
    for _ in range(x.shape[0] - start):  # then single-token decode
        out, conv, ssm = run_core(layer, config, x[start : start + 1], conv, ssm)
        outs.append(out)
        start += 1
    assert_close(torch.cat(outs), whole, gen, rtol=1e-3, atol=1e-4, what="outputs")
    assert_close(conv, t64(whole_conv), gen, what="conv state")
    assert_close(ssm, t64(whole_ssm), gen, rtol=1e-3, atol=1e-4, what="ssm state")


# ---------------------------------------------------------------------------------------------
# gated attention pieces


def test_split_query_gate_is_per_head(gen):
    tokens, heads, head_dim = 5, 3, 8
    q_proj_out = randn(gen, tokens, heads * 2 * head_dim)
    expected_q, expected_gate = torch.chunk(q_proj_out.view(tokens, heads, 2 * head_dim), 2, -1)
    query, gate = hybrid.split_query_gate(f32(q_proj_out), heads, head_dim)
    np.testing.assert_array_equal(query, f32(expected_q))
    np.testing.assert_array_equal(gate, f32(expected_gate))


def test_rope_inv_freq_matches_hf():
    config = small_text_config(head_dim=256)
    config.rope_parameters = {
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
    }
    expected, _ = qwen3_5.Qwen3_5TextRotaryEmbedding.compute_default_rope_parameters(config)
    inv_freq = hybrid.rope_default_inv_freq(1e7, 64)
    np.testing.assert_allclose(inv_freq, expected.numpy(), rtol=2e-7)


@pytest.mark.parametrize("rotary_dim,head_dim", [(64, 256), (8, 32), (32, 32)])
def test_partial_rope_matches_hf(gen, rotary_dim, head_dim):
    tokens, heads, theta = 11, 3, 1e7
    x = randn(gen, tokens, heads, head_dim)
    positions = torch.randint(0, 100_000, (tokens,), generator=gen)
    inv_freq = torch.from_numpy(hybrid.rope_default_inv_freq(theta, rotary_dim))
    angles = (positions.float()[:, None] * inv_freq[None]).double()  # fp32 product, as HF
    cos = torch.cat([angles.cos(), angles.cos()], -1)  # [T, rotary_dim]
    sin = torch.cat([angles.sin(), angles.sin()], -1)
    expected, _ = qwen3_5.apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=1)
    out = hybrid.rope_partial_neox(
        f32(x), positions.numpy().astype(np.int64), inv_freq.numpy(), rotary_dim
    )
    assert_close(out, expected, gen, what="partial rope")
    np.testing.assert_array_equal(out[..., rotary_dim:], f32(x[..., rotary_dim:]))


def test_sigmoid_gate_multiply(gen):
    x, gate = randn(gen, 4, 40), randn(gen, 4, 40, scale=4)
    out = hybrid.sigmoid_gate_multiply(f32(x), f32(gate))
    assert_close(out, x * gate.sigmoid(), gen, what="sigmoid gate")


# ---------------------------------------------------------------------------------------------
# MoE routing


@pytest.mark.parametrize("renormalize", [True, False])
def test_router_softmax_topk(gen, renormalize):
    tokens, experts, top_k = 33, 64, 8
    logits = randn(gen, tokens, experts, scale=3)
    probs = logits.softmax(-1)
    expected_w, expected_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        expected_w = expected_w / expected_w.sum(-1, keepdim=True)
    ids, weights = hybrid.moe_route_softmax_topk(f32(logits), top_k, renormalize)
    np.testing.assert_array_equal(ids, expected_ids.numpy())
    assert_close(weights, expected_w, gen, what="router weights")


def test_router_breaks_ties_to_lower_expert_id():
    logits = np.zeros((1, 6), np.float32)
    logits[0, 4] = 1.0
    ids, weights = hybrid.moe_route_softmax_topk(logits, 3, True)
    assert ids.tolist() == [[4, 0, 1]]
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-6)


def test_group_by_expert_orders_by_expert_then_token(gen):
    tokens, experts, top_k = 20, 10, 3
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    offsets, token, slot = hybrid.moe_group_by_expert(ids.numpy().astype(np.int32), experts)
    expected = sorted((int(e), t, s) for t in range(tokens) for s, e in enumerate(ids[t]))
    got = [
        (e, token[i], slot[i]) for e in range(experts) for i in range(offsets[e], offsets[e + 1])
    ]
    assert got == expected
    with pytest.raises(ValueError, match="expert id 10"):
        hybrid.moe_group_by_expert(np.full((1, 1), 10, np.int32), experts)


def test_sparse_moe_block_matches_hf(gen):
    """Routing, grouping, scatter and the gated shared expert, with expert MLPs in torch."""
    config = qwen3_5_moe.Qwen3_5MoeTextConfig(
        hidden_size=32,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=20,
        num_hidden_layers=4,
        vocab_size=64,
    )
    block = qwen3_5_moe.Qwen3_5MoeSparseMoeBlock(config).double()
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64) * 0.3)
    x = randn(gen, 1, 25, config.hidden_size)
    with torch.no_grad():
        expected = block(x)[0]
        h = x[0]
        ids, weights = hybrid.moe_route_softmax_topk(f32(h @ block.gate.weight.T), 4, True)
        offsets, token, slot = hybrid.moe_group_by_expert(ids, config.num_experts)
        token, slot = np.asarray(token, np.int32), np.asarray(slot, np.int32)
        rows = np.zeros((len(token), config.hidden_size), np.float32)
        for e in range(config.num_experts):
            sel = slice(offsets[e], offsets[e + 1])
            gate, up = F.linear(h[token[sel]], block.experts.gate_up_proj[e]).chunk(2, -1)
            rows[sel] = f32(F.linear(F.silu(gate) * up, block.experts.down_proj[e]))
        out = hybrid.moe_weighted_scatter_add(
            rows, token, weights[token, slot], np.zeros(h.shape, np.float32)
        )
        shared = block.shared_expert(h)
        out = hybrid.moe_add_gated_shared(f32(shared), f32(block.shared_expert_gate(h)[:, 0]), out)
    assert_close(out, expected, gen, rtol=1e-4, atol=1e-5, what="MoE block")


@pytest.mark.parametrize("threads", [1, 3])
def test_gdn_batch_of_lanes_equals_each_lane_alone(gen, threads):
    """Stacked sequences at different stages (decode steps and prefill runs) with their own
    carried states give exactly what each gives alone."""
    config = small_text_config()
    layer = random_gdn_layer(gen, config)
    lengths = [1, 70, 1, 3, 130, 0, 1]
    conv0, ssm0 = zero_states(config)
    conv_states = np.stack([f32(randn(gen, *conv0.shape, scale=0.5)) for _ in lengths])
    ssm_states = np.stack([f32(randn(gen, *ssm0.shape, scale=0.3)) for _ in lengths])
    x = torch.randn(sum(lengths), config.hidden_size, generator=gen)
    with torch.no_grad():
        mixed, z = layer.in_proj_qkv(x), layer.in_proj_z(x)
        b, a = layer.in_proj_b(x), layer.in_proj_a(x)
    weights = (
        f32(layer.conv1d.weight[:, 0]),
        f32(layer.A_log),
        f32(layer.dt_bias),
        f32(layer.norm.weight),
    )
    heads = dict(key_heads=config.linear_num_key_heads, key_dim=config.linear_key_head_dim)
    out, conv_after, ssm_after = hybrid.gdn_mixer_batch(
        f32(mixed),
        f32(z),
        f32(b),
        f32(a),
        *weights,
        lengths,
        conv_states,
        ssm_states,
        threads=threads,
        **heads,
    )
    start = 0
    for i, n in enumerate(lengths):
        rows = slice(start, start + n)
        alone, conv_alone, ssm_alone = hybrid.gdn_mixer_core(
            f32(mixed[rows]),
            f32(z[rows]),
            f32(b[rows]),
            f32(a[rows]),
            *weights,
            conv_states[i],
            ssm_states[i],
            **heads,
        )
        np.testing.assert_array_equal(out[rows], alone, err_msg=f"lane {i}")
        np.testing.assert_array_equal(conv_after[i], conv_alone)
        np.testing.assert_array_equal(ssm_after[i], ssm_alone)
        start += n
    with pytest.raises(ValueError, match="lengths"):
        hybrid.gdn_mixer_batch(
            f32(mixed),
            f32(z),
            f32(b),
            f32(a),
            *weights,
            [1] * len(lengths),
            conv_states,
            ssm_states,
            **heads,
        )


def test_portable_gemm_path_matches_default(tmp_path, gen):
    """The chunked form with NINFER_CPU_KERNELS=scalar (portable GEMM) equals the default path."""
    import os
    import subprocess
    import sys

    q, k, v, g, beta, state = delta_rule_inputs(gen, 150, 2, 4, 32, 32, decay_scale=0.3)
    args = [f32(x) for x in (q, k, v, g, beta, state)]
    np.savez(tmp_path / "in.npz", *args)
    out, new_state = hybrid.delta_rule_chunked(*args)
    script = (
        "import sys, numpy as np; from ninfer._core import hybrid; "
        "d = np.load(sys.argv[1]); a = [d[f'arr_{i}'] for i in range(6)]; "
        "o, s = hybrid.delta_rule_chunked(*a); np.savez(sys.argv[2], o, s)"
    )
    env = dict(os.environ, NINFER_CPU_KERNELS="scalar")
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        env=env,
        check=True,
    )
    portable = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(portable["arr_0"], out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(portable["arr_1"], new_state, rtol=1e-4, atol=1e-5)
