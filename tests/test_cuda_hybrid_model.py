"""Qwen3.5/3.6 hybrid models (dense and MoE) on the CUDA backend against transformers.

Small random artifacts (make_random_artifact) whose head dims the CUDA kernels take (GDN key
dim 64, value dim 32; attention head dim 64). The reference is transformers in float32 with
the artifact's bf16 weights; what differs is the CUDA backend's bf16 GEMM inputs and KV cache.
GPU machine only.
"""

from __future__ import annotations

import numpy as np
import pytest

from ninfer import _core

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from qwen3_5_hf_bridge import hf_model_from_artifact  # noqa: E402

VOCAB = 400
SMALL = dict(
    hidden_size=128, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=64, linear_value_head_dim=32, vocab_size=VOCAB, mtp_num_hidden_layers=0,
)
CONFIGS = {
    "dense": dict(SMALL, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text"),
    "moe": {
        **{k: v for k, v in SMALL.items() if k != "intermediate_size"},
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 96,
    },
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory):
    path = make_random_artifact(CONFIGS[request.param],
                                tmp_path_factory.mktemp(request.param) / "m.ninfer",
                                seed=11, tokenizer="synthetic")
    model, _ = hf_model_from_artifact(path)
    return request.param, model, path


def _runner(path, lanes=1, batch=512, context=1024):
    return _core.ModelRunner(str(path), max_lanes=lanes, max_batch_tokens=batch,
                             max_context=context, device="cuda")


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].double().numpy()


def _tokens(seed, n):
    return np.random.default_rng(seed).integers(0, VOCAB, size=n).tolist()


def _rel(ours, ref):
    assert np.all(np.isfinite(ours))
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def test_prefill_logits_match_transformers(case):
    name, model, path = case
    ids = _tokens(1, 150)  # > 2 GDN chunks of 64, 3 KV pages
    ours = _runner(path).forward(0, 0, ids, all_logits=True)
    ref = _hf_logits(model, ids)
    err = _rel(ours, ref)
    agree = float(np.mean(ours.argmax(1) == ref.argmax(1)))
    rows = np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"hybrid {name}: prefill rel err {err:.2e}, argmax agreement {agree:.3f}, per-row "
          f"median {np.median(rows):.2e}, max {rows.max():.2e} at row {int(rows.argmax())}")
    # MoE: this random router (std 0.02) makes near-uniform expert probabilities; for this
    # prompt the gap between the 2nd and 3rd expert is under 2e-3 for 101 of 150 tokens in some
    # layer (0 for token 7), so bf16 GEMM inputs flip some top-k choices (rows 3 and 7 are the
    # first with a large error), and a flipped token reaches later ones through attention and
    # the GDN state. Measured 2026-11-29 on the H200: median row error 1.05e-2, overall 4.15e-2,
    # argmax agreement 0.987 (dense: 6.6e-3, 7.1e-3, 0.987). Scaling the router does not help:
    # the logit gaps and the rounding noise scale together.
    assert np.median(rows) < (2e-2 if name == "moe" else 1e-2) and agree > 0.95
    assert err < (6e-2 if name == "moe" else 3e-2)


def test_prefill_pieces_then_decode_match_transformers(case):
    """State carried across prefill chunks and decode steps equals one pass."""
    name, model, path = case
    ids = _tokens(2, 120)
    runner = _runner(path)
    runner.forward(0, 0, ids[:50])
    runner.forward(0, 50, ids[50:113])
    rows = [runner.forward(0, 113 + i, [ids[113 + i]]) for i in range(7)]
    ref = _hf_logits(model, ids)[-7:]
    err = _rel(np.stack(rows), ref)
    print(f"hybrid {name}: pieces + decode rel err {err:.2e}")
    assert err < 3e-2


def test_batched_equals_alone(case):
    name, _, path = case
    seqs = [_tokens(10 + i, n) for i, n in enumerate((90, 33, 70, 5))]
    alone = []
    for ids in seqs:
        runner = _runner(path)
        runner.forward(0, 0, ids[:-1])
        alone.append(runner.forward(0, len(ids) - 1, [ids[-1]]))
    runner = _runner(path, lanes=4)
    runner.forward(0, 0, seqs[0][:89])
    runner.forward(1, 0, seqs[1][:20])
    runner.forward(3, 0, seqs[3][:4])
    mixed = runner.forward_batch(
        [(0, 89, seqs[0][89:]), (1, 20, seqs[1][20:]), (2, 0, seqs[2]), (3, 4, seqs[3][4:])])
    for lane, ref in enumerate(alone):
        err = _rel(mixed[lane].astype(np.float64), ref.astype(np.float64))
        print(f"hybrid {name}: lane {lane} batched vs alone rel err {err:.2e}")
        assert err < 1e-2


def test_greedy_generation_matches_transformers(case):
    name, model, path = case
    prompt, new = _tokens(3, 40), 32
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new,
                             min_new_tokens=new, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
    hf = _hf_logits(model, prompt + ref)[len(prompt) - 1:]
    runner = _runner(path)
    logits = runner.forward(0, 0, prompt)
    mismatches = []
    for i in range(new):  # teacher-forced: fed the reference's tokens
        ours = int(np.argmax(logits))
        if ours != ref[i]:
            mismatches.append((i, float((hf[i][ref[i]] - hf[i][ours]) / np.abs(hf[i]).max())))
        logits = runner.forward(0, len(prompt) + i, [ref[i]])
    print(f"hybrid {name}: teacher-forced greedy mismatches (step, margin/scale): {mismatches}")
    assert all(rel_margin < 0.02 for _, rel_margin in mismatches)
    assert len(mismatches) <= new // 8
