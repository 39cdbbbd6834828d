"""The CUDA hybrid-model kernels (`_core.CudaHybridOps`) against float64 references.

Same math as the CPU kernels' tests (tests/test_hybrid_ops.py): Gated DeltaNet conv/norm/gates/
delta rule over per-lane state slots, the gated and zero-centred RMSNorms, the attention
query/gate split and sigmoid gate, MoE routing and combination. Fresh random inputs per test
(the seed is in every failure message); outputs are poisoned with NaN so an unwritten element
fails. Runs only where a CUDA device exists (tools/gpu/check.sh on the GPU machine).
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from ninfer import _core

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]


@pytest.fixture(scope="module")
def ops():
    return _core.CudaHybridOps(0)


class SeededRng:
    """A numpy Generator that remembers its seed (for failure messages)."""

    def __init__(self, seed: int) -> None:
        self.seed_value = seed
        self._gen = np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self._gen, name)


@pytest.fixture
def rng():
    return SeededRng(secrets.randbits(31))


def randn(rng, *shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def poisoned(*shape) -> np.ndarray:
    return np.full(shape, np.nan, dtype=np.float32)


def check(ours: np.ndarray, ref: np.ndarray, rng, tol: float, what: str = "") -> None:
    assert np.all(np.isfinite(ours)), (
        f"{what} (seed {rng.seed_value}): unwritten (NaN) or non-finite elements"
    )
    err = np.linalg.norm(ours.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err < tol, f"{what} (seed {rng.seed_value}): relative error {err:.3g} >= {tol}"


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lanes_layout(lengths, slots):
    seqs, row = [], 0
    for n, slot in zip(lengths, slots, strict=True):
        seqs.append((row, n, slot))
        row += n
    return seqs, row


# --- causal conv1d ---------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", [2, 4])
@pytest.mark.parametrize("lengths", [[1, 1, 1, 1, 1], [2, 64, 5], [3, 1, 70, 130, 2]])
def test_conv1d_silu_with_state_slots(ops, rng, kernel, lengths):
    channels, num_slots = 200, 8
    slots = rng.permutation(num_slots)[: len(lengths)].tolist()
    seqs, rows = lanes_layout(lengths, slots)
    x = randn(rng, rows, channels)
    w = randn(rng, channels, kernel, scale=0.5)
    states = randn(rng, num_slots, kernel - 1, channels)
    before = states.copy()
    out = poisoned(rows, channels)
    history = poisoned(rows, kernel - 1, channels)
    ops.causal_conv1d_silu(x, w, seqs, states, out, history)
    ref = np.zeros((rows, channels))
    used = set()
    for begin, n, slot in seqs:
        used.add(slot)
        full = np.concatenate(
            [before[slot].astype(np.float64), x[begin : begin + n].astype(np.float64)]
        )
        for t in range(n):
            ref[begin + t] = silu(np.sum(full[t : t + kernel].T * w, axis=1))
            np.testing.assert_array_equal(
                history[begin + t],
                full[t + 1 : t + kernel].astype(np.float32),
                err_msg=f"conv state after token {t} (seed {rng.seed_value})",
            )
        np.testing.assert_array_equal(
            states[slot],
            full[-(kernel - 1) :].astype(np.float32),
            err_msg=f"state of slot {slot} (seed {rng.seed_value})",
        )
    check(out, ref, rng, 1e-5, "conv output")
    for slot in set(range(num_slots)) - used:
        np.testing.assert_array_equal(states[slot], before[slot], err_msg="an unused slot changed")


# --- norms and gates ---------------------------------------------------------------------------


def test_l2norm_heads(ops, rng):
    x = randn(rng, 9, 6, 128)
    ref = 0.25 * x / np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)
    ops.l2norm_heads(x, 0.25, 1e-6)
    check(x, ref, rng, 1e-6, "l2norm")


def test_gdn_gates(ops, rng):
    tokens, heads = 13, 48
    b, a = randn(rng, tokens, heads, scale=3), randn(rng, tokens, heads, scale=10)
    a_log, dt_bias = randn(rng, heads), randn(rng, heads)
    beta, g = poisoned(tokens, heads), poisoned(tokens, heads)
    ops.gdn_gates(b, a, a_log, dt_bias, beta, g)
    s = a.astype(np.float64) + dt_bias
    softplus = np.where(s > 20, s, np.log1p(np.exp(np.minimum(s, 20))))
    check(beta, sigmoid(b.astype(np.float64)), rng, 1e-6, "beta")
    check(g, -np.exp(a_log.astype(np.float64)) * softplus, rng, 1e-6, "g")


# 128/256/512 take the warp-a-row kernel (rows not a multiple of its 4 warps a block), the
# others the block-a-row one.
@pytest.mark.parametrize(
    "rows, dim", [(50, 128), (1027, 128), (33, 256), (9, 512), (50, 96), (5, 2048)]
)
def test_gated_rmsnorm(ops, rng, rows, dim):
    x, z, w = randn(rng, rows, dim), randn(rng, rows, dim), randn(rng, dim)
    out = poisoned(rows, dim)
    ops.gated_rmsnorm(x, z, w, 1e-6, out)
    x64 = x.astype(np.float64)
    ref = (
        w
        * x64
        / np.sqrt(np.mean(x64**2, axis=1, keepdims=True) + 1e-6)
        * silu(z.astype(np.float64))
    )
    check(out, ref, rng, 1e-6, "gated rmsnorm")


@pytest.mark.parametrize("dim", [96, 128, 256, 512, 5120])
def test_rmsnorm_zero_centered(ops, rng, dim):
    x, w = randn(rng, 7, dim), randn(rng, dim, scale=0.1)
    out = poisoned(7, dim)
    ops.rmsnorm_zero_centered(x, w, 1e-6, out)
    x64 = x.astype(np.float64)
    check(
        out,
        x64 / np.sqrt(np.mean(x64**2, axis=1, keepdims=True) + 1e-6) * (1 + w.astype(np.float64)),
        rng,
        1e-6,
        "zero-centred rmsnorm",
    )


def test_split_query_gate_and_sigmoid_gate(ops, rng):
    qp = randn(rng, 5, 3, 2 * 64)
    q, gate = poisoned(5, 3, 64), poisoned(5, 3, 64)
    ops.split_query_gate(qp, q, gate)
    np.testing.assert_array_equal(q, qp[:, :, :64])
    np.testing.assert_array_equal(gate, qp[:, :, 64:])
    x = randn(rng, 5, 3, 64)
    ref = x.astype(np.float64) * sigmoid(gate.astype(np.float64))
    ops.sigmoid_gate_multiply(x, gate)
    check(x, ref, rng, 1e-6, "sigmoid gate")


# --- gated delta rule -------------------------------------------------------------------------


def delta_rule_reference(q, k, v, g, beta, state):
    ratio = v.shape[1] // k.shape[1]
    q = np.repeat(q.astype(np.float64), ratio, axis=1)
    k = np.repeat(k.astype(np.float64), ratio, axis=1)
    s = state.astype(np.float64).copy()
    outs, history = [], []
    for t in range(q.shape[0]):
        s = s * np.exp(g[t].astype(np.float64))[:, None, None]
        memory = np.einsum("hij,hi->hj", s, k[t])
        delta = beta[t].astype(np.float64)[:, None] * (v[t] - memory)
        s = s + k[t][:, :, None] * delta[:, None, :]
        outs.append(np.einsum("hij,hi->hj", s, q[t]))
        history.append(s.copy())
    return np.stack(outs), s, np.stack(history)


def unit_heads(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize(
    "hk,hv,dk,dv",
    [(2, 2, 64, 32), (2, 4, 64, 40), (2, 6, 128, 64), (4, 8, 128, 128), (1, 2, 256, 32)],
)
@pytest.mark.parametrize("lengths", [[1, 1, 1], [1, 7, 33]])
def test_gated_delta_rule_over_state_slots(ops, rng, hk, hv, dk, dv, lengths):
    num_slots = 5
    slots = rng.permutation(num_slots)[: len(lengths)].tolist()
    seqs, rows = lanes_layout(lengths, slots)
    q = unit_heads(randn(rng, rows, hk, dk)) * np.float32(dk**-0.5)
    k = unit_heads(randn(rng, rows, hk, dk))
    v = randn(rng, rows, hv, dv)
    g = (-rng.random((rows, hv))).astype(np.float32)
    beta = rng.random((rows, hv)).astype(np.float32)
    states = randn(rng, num_slots, hv, dk, dv, scale=0.5)
    before = states.copy()
    out = poisoned(rows, hv, dv)
    history = poisoned(rows, hv, dk, dv)
    ops.gated_delta_rule(q, k, v, g, beta, seqs, states, out, history)
    for begin, n, slot in seqs:
        sl = slice(begin, begin + n)
        ref_out, ref_state, ref_history = delta_rule_reference(
            q[sl], k[sl], v[sl], g[sl], beta[sl], before[slot]
        )
        check(out[sl], ref_out, rng, 2e-5, f"out of lane in slot {slot}")
        check(states[slot], ref_state, rng, 2e-5, f"state of slot {slot}")
        check(history[sl], ref_history, rng, 2e-5, f"per-token states of slot {slot}")
    for slot in set(range(num_slots)) - set(slots):
        np.testing.assert_array_equal(states[slot], before[slot], err_msg="an unused slot changed")


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


@pytest.mark.parametrize(
    "hk,hv,dk,dv", [(2, 4, 64, 40), (16, 32, 128, 128), (1, 2, 256, 32)], ids=str
)
@pytest.mark.parametrize("lengths", [[1, 1, 1], [1, 7, 33]])
@pytest.mark.parametrize("overlap", [False, True])
def test_gated_delta_rule_prepared_folds_in_the_norms_and_gates(
    ops, rng, hk, hv, dk, dv, lengths, overlap
):
    """The decode form: raw q/k (normalised in the kernel, q by 1/sqrt(dk) too) and raw a/b
    (beta and g computed in the kernel) against float64 norms, gates and delta rule."""
    num_slots = 5
    slots = rng.permutation(num_slots)[: len(lengths)].tolist()
    seqs, rows = lanes_layout(lengths, slots)
    q, k = randn(rng, rows, hk, dk, scale=3.0), randn(rng, rows, hk, dk, scale=0.5)
    v = randn(rng, rows, hv, dv)
    a, b = randn(rng, rows, hv, scale=2.0), randn(rng, rows, hv, scale=2.0)
    a[0, 0] = 25.0  # past softplus's threshold
    A_log, dt_bias = randn(rng, hv, scale=0.5), randn(rng, hv, scale=0.5)
    states = randn(rng, num_slots, hv, dk, dv, scale=0.5)
    before = states.copy()
    out = poisoned(rows, hv, dv)
    history = poisoned(rows, hv, dk, dv)
    ops.gated_delta_rule_prepared(
        q, k, v, a, b, A_log, dt_bias, seqs, states, out, history, overlap=overlap
    )

    def unit64(x):
        x = x.astype(np.float64)
        return x / np.sqrt(np.sum(x**2, axis=-1, keepdims=True) + 1e-6)

    qn, kn = unit64(q) * dk**-0.5, unit64(k)
    beta = sigmoid(b.astype(np.float64))
    g = -np.exp(A_log.astype(np.float64)) * softplus(a.astype(np.float64) + dt_bias)
    for begin, n, slot in seqs:
        sl = slice(begin, begin + n)
        ref_out, ref_state, ref_history = delta_rule_reference(
            qn[sl], kn[sl], v[sl], g[sl], beta[sl], before[slot]
        )
        check(out[sl], ref_out, rng, 2e-5, f"out of lane in slot {slot}")
        check(states[slot], ref_state, rng, 2e-5, f"state of slot {slot}")
        check(history[sl], ref_history, rng, 2e-5, f"per-token states of slot {slot}")
    for slot in set(range(num_slots)) - set(slots):
        np.testing.assert_array_equal(states[slot], before[slot], err_msg="an unused slot changed")


def test_gated_delta_rule_split_calls_equal_one_call(ops, rng):
    hk, hv, dk, dv, n = 2, 4, 128, 64, 20
    q = unit_heads(randn(rng, n, hk, dk)) * np.float32(dk**-0.5)
    k = unit_heads(randn(rng, n, hk, dk))
    v, g = randn(rng, n, hv, dv), (-rng.random((n, hv))).astype(np.float32)
    beta = rng.random((n, hv)).astype(np.float32)
    state0 = randn(rng, 1, hv, dk, dv, scale=0.5)
    one, out_one = state0.copy(), poisoned(n, hv, dv)
    ops.gated_delta_rule(q, k, v, g, beta, [(0, n, 0)], one, out_one)
    two, outs = state0.copy(), []
    for a, b in ((0, 9), (9, 10), (10, n)):
        part = poisoned(b - a, hv, dv)
        ops.gated_delta_rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], [(0, b - a, 0)], two, part)
        outs.append(part)
    check(np.concatenate(outs), out_one.astype(np.float64), rng, 1e-6, "split outputs")
    check(two, one.astype(np.float64), rng, 1e-6, "split state")


# The chunked form multiplies bf16 operands on tensor cores (fp32 state and accumulation): its
# relative errors are a few 1e-3; a wrong index, mask or decay gives O(0.1-1).
CHUNKED_TOL = 1e-2


def rel_err(ours, ref) -> float:
    return float(np.linalg.norm(ours.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def delta_rule_inputs(rng, rows, hk, hv, dk, dv, decay=0.5):
    q = unit_heads(randn(rng, rows, hk, dk)) * np.float32(dk**-0.5)
    k = unit_heads(randn(rng, rows, hk, dk))
    v = randn(rng, rows, hv, dv)
    g = (-rng.random((rows, hv)) * decay).astype(np.float32)
    beta = rng.random((rows, hv)).astype(np.float32)
    return q, k, v, g, beta


def check_chunked_against_recurrent_and_reference(ops, rng, lengths, hk, hv, dk, dv, decay=0.5):
    """One call of each form over lanes of `lengths` tokens, each in its own state slot (with a
    prior state), lanes in shuffled slots; unused slots must stay untouched."""
    num_slots = len(lengths) + 1
    slots = rng.permutation(num_slots)[: len(lengths)].tolist()
    seqs, rows = lanes_layout(lengths, slots)
    q, k, v, g, beta = delta_rule_inputs(rng, rows, hk, hv, dk, dv, decay)
    before = randn(rng, num_slots, hv, dk, dv, scale=0.5)
    chunked_states, chunked_out = before.copy(), poisoned(rows, hv, dv)
    ops.gated_delta_rule(q, k, v, g, beta, seqs, chunked_states, chunked_out, chunked=True)
    rec_states, rec_out = before.copy(), poisoned(rows, hv, dv)
    ops.gated_delta_rule(q, k, v, g, beta, seqs, rec_states, rec_out)
    for begin, n, slot in seqs:
        if n == 0:
            np.testing.assert_array_equal(chunked_states[slot], before[slot], err_msg="empty lane")
            continue
        sl = slice(begin, begin + n)
        ref_out, ref_state, _ = delta_rule_reference(
            q[sl], k[sl], v[sl], g[sl], beta[sl], before[slot]
        )
        print(
            f"chunked vs float64, {n} tokens, heads {hk}/{hv}, dims {dk}/{dv}, decay {decay}: "
            f"out {rel_err(chunked_out[sl], ref_out):.2e}, "
            f"state {rel_err(chunked_states[slot], ref_state):.2e}"
        )
        check(chunked_out[sl], ref_out, rng, CHUNKED_TOL, f"chunked out, {n} tokens")
        check(chunked_states[slot], ref_state, rng, CHUNKED_TOL, f"chunked state, {n} tokens")
        check(rec_out[sl], ref_out, rng, 2e-4, f"recurrent out, {n} tokens")
        check(
            chunked_out[sl],
            rec_out[sl].astype(np.float64),
            rng,
            CHUNKED_TOL,
            f"chunked vs recurrent, {n}",
        )
        check(
            chunked_states[slot],
            rec_states[slot].astype(np.float64),
            rng,
            CHUNKED_TOL,
            f"states, {n}",
        )
    for slot in set(range(num_slots)) - set(slots):
        np.testing.assert_array_equal(chunked_states[slot], before[slot], err_msg="unused slot")


@pytest.mark.parametrize(
    "hk,hv,dk,dv",
    [(2, 4, 128, 64), (1, 2, 64, 32), (2, 4, 64, 128), (2, 2, 64, 96), (16, 48, 128, 128)],
)
def test_gated_delta_rule_chunked_equals_recurrent_and_reference(ops, rng, hk, hv, dk, dv):
    """Chunked (64-token chunks) == recurrent == float64 reference over lanes of 1, 63, 64, 65,
    130 and 0 tokens in one call (partial, exact and multi-chunk); both tile widths (dv % 64 and
    dv % 32 only), both key dims, and the Qwen3.6-27B head counts."""
    lengths = [1, 63, 64, 0, 65, 130] if hv <= 8 else [65, 1, 130, 64]
    check_chunked_against_recurrent_and_reference(ops, rng, lengths, hk, hv, dk, dv)


@pytest.mark.parametrize("decay", [0.05, 1.0, 8.0])
def test_gated_delta_rule_chunked_long_lanes(ops, rng, decay):
    """Lanes of 1000 and 333 tokens: weak decay (the state carries over many chunks) to strong
    (e^G underflows inside a chunk)."""
    check_chunked_against_recurrent_and_reference(ops, rng, [1000, 333], 2, 6, 128, 128, decay)


def test_gated_delta_rule_chunked_split_calls_carry_state(ops, rng):
    """The state carried across chunked calls of 1, 63, 64 and 65 tokens equals one call."""
    hk, hv, dk, dv = 2, 4, 128, 64
    parts = [1, 63, 64, 65]
    n = sum(parts)
    q, k, v, g, beta = delta_rule_inputs(rng, n, hk, hv, dk, dv, decay=1.0)
    state0 = randn(rng, 1, hv, dk, dv, scale=0.5)
    ref_out, ref_state, _ = delta_rule_reference(q, k, v, g, beta, state0[0])
    state, outs, a = state0.copy(), [], 0
    for m in parts:
        part = poisoned(m, hv, dv)
        sl = slice(a, a + m)
        ops.gated_delta_rule(
            q[sl], k[sl], v[sl], g[sl], beta[sl], [(0, m, 0)], state, part, chunked=True
        )
        outs.append(part)
        a += m
    check(np.concatenate(outs), ref_out, rng, CHUNKED_TOL, "split chunked outputs")
    check(state[0], ref_state, rng, CHUNKED_TOL, "split chunked state")


def test_gated_delta_rule_chunked_rejects_history(ops, rng):
    q = np.zeros((2, 1, 64), np.float32)
    v = np.zeros((2, 1, 32), np.float32)
    gb = np.zeros((2, 1), np.float32)
    with pytest.raises(ValueError, match="history"):
        ops.gated_delta_rule(
            q,
            q,
            v,
            gb,
            gb,
            [(0, 2, 0)],
            np.zeros((1, 1, 64, 32), np.float32),
            np.zeros((2, 1, 32), np.float32),
            np.zeros((2, 1, 64, 32), np.float32),
            chunked=True,
        )


# --- MoE ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "experts,top_k,renormalize", [(256, 8, True), (40, 3, False), (512, 10, True)]
)
def test_moe_route_softmax_topk(ops, rng, experts, top_k, renormalize):
    tokens = 37
    logits = randn(rng, tokens, experts, scale=2)
    ids, weights = np.full((tokens, top_k), -1, np.int32), poisoned(tokens, top_k)
    ops.moe_route(logits, top_k, renormalize, ids, weights)
    l64 = logits.astype(np.float64)
    p = np.exp(l64 - l64.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    order = np.argsort(-p, axis=1, kind="stable")[:, :top_k]
    np.testing.assert_array_equal(ids, order, err_msg=f"expert ids (seed {rng.seed_value})")
    ref = np.take_along_axis(p, order, axis=1)
    if renormalize:
        ref /= ref.sum(axis=1, keepdims=True)
    check(weights, ref, rng, 1e-5, "routing weights")


def test_moe_route_ties_go_to_lower_expert_id(ops):
    logits = np.zeros((2, 64), np.float32)
    logits[1, [5, 9, 40]] = 1.0
    ids, weights = np.full((2, 4), -1, np.int32), poisoned(2, 4)
    ops.moe_route(logits, 4, True, ids, weights)
    np.testing.assert_array_equal(ids, [[0, 1, 2, 3], [5, 9, 40, 0]])
    assert np.all(np.isfinite(weights))


def test_moe_combine_and_shared_expert(ops, rng):
    tokens, top_k, hidden = 11, 4, 96
    rows = randn(rng, tokens * top_k, hidden)
    row_of = rng.permutation(tokens * top_k).astype(np.int32).reshape(tokens, top_k)
    weights = rng.random((tokens, top_k)).astype(np.float32)
    out = randn(rng, tokens, hidden)
    ref = out.astype(np.float64) + np.einsum(
        "ts,tsh->th", weights.astype(np.float64), rows[row_of].astype(np.float64)
    )
    ops.moe_combine(rows, row_of, weights, out)
    check(out, ref, rng, 1e-6, "combine")
    shared, gate_logit = randn(rng, tokens, hidden), randn(rng, tokens)
    ref = out.astype(np.float64) + sigmoid(gate_logit.astype(np.float64))[:, None] * shared
    ops.moe_add_gated_shared(shared, gate_logit, out)
    check(out, ref, rng, 1e-6, "gated shared expert")
