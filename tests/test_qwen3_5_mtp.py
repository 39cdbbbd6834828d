"""The native MTP head (Qwen35Model::forward_mtp through ModelRunner.forward_mtp) against the
float64 reference of the same math (qwen3_5_reference.py, itself checked against transformers'
pieces), on random artifacts: a prefill of shifted pairs, then draft steps that feed back the
head's own normed hidden and continue its KV cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import qwen3_5_reference as ref  # noqa: E402
from ninfer import _core  # noqa: E402
from ninfer.convert.random import make_random_artifact  # noqa: E402
from qwen3_5_hf_bridge import artifact_state_dict  # noqa: E402

SMALL = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=6,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=6,
    linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=400, mtp_num_hidden_layers=1,
)
CONFIGS = {
    "qwen3_5": dict(SMALL, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text"),
    "qwen3_5_moe": {
        **{k: v for k, v in SMALL.items() if k != "intermediate_size"},
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "tie_word_embeddings": True,
    },
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory) -> tuple[Path, dict, dict]:
    path = make_random_artifact(CONFIGS[request.param], tmp_path_factory.mktemp("mtp") / "a.ninfer",
                                seed=8, dtype="f32", tokenizer="synthetic")
    _, config, tensors = artifact_state_dict(path)
    weights = {n: torch.from_numpy(a.astype(np.float64)) for n, a in tensors.items()}
    return path, config, weights


def _close(ours: np.ndarray, exact: torch.Tensor, what: str) -> None:
    exact_np = exact.numpy()
    error, scale = np.abs(ours - exact_np).max(), np.abs(exact_np).max()
    assert error <= 2e-6 * scale, f"{what}: {error:.3g} (scale {scale:.3g})"


def test_mtp_prefill_and_draft_steps_match_reference(case):
    path, config, w = case
    rng = np.random.default_rng(4)
    hidden_size, pairs = config["hidden_size"], 40
    runner = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2)
    cache = ref.KvCache()
    # Prefill: slot i pairs the main model's normed hidden h_i with token x_{i+1}.
    hidden = rng.standard_normal((pairs, hidden_size)).astype(np.float32)
    tokens = rng.integers(0, config["vocab_size"], pairs).tolist()
    logits, normed = runner.forward_mtp(0, 0, tokens, hidden, step=0)
    exact_logits, exact_normed = ref.mtp_forward(
        w, config, torch.from_numpy(hidden.astype(np.float64)), torch.tensor(tokens),
        torch.arange(pairs), cache)
    _close(logits, exact_logits, "prefill logits")
    _close(normed, exact_normed, "prefill hidden")
    # Draft steps: feed back the head's own hidden and greedy token at the next position.
    h, token = normed[-1:], int(logits[-1].argmax())
    for step in range(1, 4):
        position = pairs - 1 + step
        logits, h_next = runner.forward_mtp(0, position, [token], h, step=step)
        exact_logits, exact_h = ref.mtp_forward(
            w, config, torch.from_numpy(h.astype(np.float64)), torch.tensor([token]),
            torch.tensor([position]), cache, step)
        _close(logits, exact_logits, f"draft step {step} logits")
        _close(h_next, exact_h, f"draft step {step} hidden")
        h, token = h_next, int(logits[0].argmax())


def test_the_proposal_head_scores_the_lowest_ids_exactly_as_the_full_head(case):
    """--lm-head-draft: the head's logits over ids 0..N-1 are the full head's first N columns,
    through the prefill of pairs and the draft steps that follow."""
    path, config, _ = case
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal((12, config["hidden_size"])).astype(np.float32)
    tokens = rng.integers(0, config["vocab_size"], 12).tolist()
    runs = []
    for proposal in (0, 128):
        runner = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2,
                                   proposal_vocab=proposal)  # fmt: skip
        logits, normed = runner.forward_mtp(0, 0, tokens, hidden, step=0)
        steps = [(logits, normed)]
        for step in range(1, 3):
            steps.append(runner.forward_mtp(0, 11 + step, [7 * step], steps[-1][1][-1:], step=step))
        runs.append(steps)
    for (full, full_h), (part, part_h) in zip(*runs, strict=True):
        assert full.shape[1] == config["vocab_size"] and part.shape[1] == 128
        np.testing.assert_array_equal(part, full[:, :128])
        np.testing.assert_array_equal(part_h, full_h)


def test_mtp_rejects_bad_inputs(case):
    path, config, _ = case
    runner = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2)
    with pytest.raises(ValueError, match="hidden_prev"):
        runner.forward_mtp(0, 0, [1, 2], np.zeros((3, config["hidden_size"]), np.float32))
    with pytest.raises(ValueError, match="step"):
        runner.forward_mtp(0, 0, [1], np.zeros((1, config["hidden_size"]), np.float32), step=-1)


def test_model_without_mtp_head_says_so(tmp_path):
    config = dict(CONFIGS["qwen3_5"], mtp_num_hidden_layers=0)
    path = make_random_artifact(config, tmp_path / "a.ninfer", seed=1, dtype="f32",
                                tokenizer="synthetic")
    runner = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=16, threads=2)
    assert runner.info["num_kv_layers"] == 1  # one full-attention layer, no MTP layer
    with pytest.raises(RuntimeError, match="no MTP head"):
        runner.forward_mtp(0, 0, [1], np.zeros((1, 64), np.float32))


def test_the_proposal_head_also_scores_its_extra_ids_from_their_own_rows(case):
    """--lm-head-draft with extra ids (EOS, thinking and tool markers): their columns follow
    the prefix in ascending id order, each equal to the full head's column of that id, so the
    argmax over the proposal columns, mapped through proposal_ids, is the full head's argmax
    whenever that lies in the subset."""
    path, config, _ = case
    vocab = config["vocab_size"]
    rng = np.random.default_rng(6)
    hidden = rng.standard_normal((12, config["hidden_size"])).astype(np.float32)
    tokens = rng.integers(0, vocab, 12).tolist()
    full_runner = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2)
    full, _ = full_runner.forward_mtp(0, 0, tokens, hidden, step=0)
    winners = sorted({int(i) for i in full.argmax(axis=1)} - set(range(64)))
    extras = [vocab - 1, *winners, vocab - 2, 5, vocab + 7, winners[0] if winners else 6]
    runner = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2,
                               proposal_vocab=64)  # fmt: skip
    runner.set_proposal_extra_ids(extras)
    ids = runner.proposal_ids
    # Inside-prefix ids, ids outside the vocabulary and duplicates add nothing.
    expected = sorted(set(extras) - set(range(64)) - {vocab + 7})
    assert ids == list(range(64)) + expected
    part, _ = runner.forward_mtp(0, 0, tokens, hidden, step=0)
    assert part.shape == (12, len(ids))
    np.testing.assert_array_equal(part, full[:, ids])
    for row in range(12):
        assert ids[int(part[row].argmax())] == int(full[row].argmax())
    # A draft step (one row) too, and clearing the extras gives back the bare prefix.
    step_part, _ = runner.forward_mtp(0, 12, [3], hidden[-1:], step=1)
    step_full, _ = full_runner.forward_mtp(0, 12, [3], hidden[-1:], step=1)
    np.testing.assert_array_equal(step_part, step_full[:, ids])
    runner.set_proposal_extra_ids([])
    assert runner.proposal_ids == list(range(64))
