"""Decode steps replayed as CUDA graphs equal eager decode exactly.

Two runners on the same random artifact run the same prefill and the same decode steps, one
with NINFER_CUDA_GRAPHS=0 (eager) and one with graphs on; both fix the matmul path
(NINFER_CUDA_MATMUL=gemv) so that no timed choice differs between them. A graph replays the
very kernels, launch shapes and split counts of the eager step (the split count follows the
page count rounded up to a power of two in both modes), so logits must be bit-identical. The
decode runs long enough to cross page boundaries (64 tokens) and page-count buckets, and most
of its steps must really be replays (_core.cuda_graph_replays counts them).
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

from ninfer.convert.random import make_random_artifact  # noqa: E402

VOCAB = 400
DENSE = dict(
    hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, vocab_size=VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_position_embeddings=4096, tie_word_embeddings=False,
)
HYBRID = dict(
    hidden_size=128, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=64, linear_value_head_dim=32, vocab_size=VOCAB, mtp_num_hidden_layers=0,
)
CONFIGS = {
    "llama": dict(DENSE, architectures=["LlamaForCausalLM"], model_type="llama"),
    "qwen3": dict(DENSE, architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
    "qwen3_5": dict(HYBRID, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text"),
    "qwen3_5_moe": {
        **{k: v for k, v in HYBRID.items() if k != "intermediate_size"},
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 96,
    },
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def artifact(request, tmp_path_factory):
    return make_random_artifact(CONFIGS[request.param],
                                tmp_path_factory.mktemp(request.param) / "m.ninfer",
                                seed=5, tokenizer="synthetic")


def _tokens(seed, n):
    return np.random.default_rng(seed).integers(0, VOCAB, size=n).tolist()


def _decode(path, monkeypatch, graphs: bool, prompts, steps: int):
    """Prefills every lane, then `steps` batched one-token steps; returns the logits per step."""
    monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")
    monkeypatch.setenv("NINFER_CUDA_GRAPHS", "1" if graphs else "0")
    runner = _core.ModelRunner(str(path), max_lanes=len(prompts), max_batch_tokens=256,
                               max_context=512, device="cuda")
    for lane, ids in enumerate(prompts):
        runner.forward(lane, 0, ids)
    pos = [len(ids) for ids in prompts]
    feed = _tokens(99, steps + 1)
    out = []
    for i in range(steps):
        step = [(lane, pos[lane], [feed[i] + lane]) for lane in range(len(prompts))]
        out.append(runner.forward_batch(step))
        pos = [p + 1 for p in pos]
    return np.stack(out)


@pytest.mark.parametrize("batch", [1, 3, 8, 12])  # 12: m > 8, the stream-K GEMV
@pytest.mark.parametrize("gemv", ["auto", "1"])  # 1: every bf16 GEMV stream-K, at every m
def test_graph_decode_equals_eager(artifact, monkeypatch, batch, gemv):
    # Graph replay and eager run each kernel with programmatic dependent launch, so a kernel
    # that reads its input before its wait (2026-12-03: ptxas placed the stream-K GEMV's
    # __ldg loads of x above it) reads it at a different moment in each: they differ.
    if gemv != "auto":
        monkeypatch.setenv("NINFER_GEMV_VARIANT", gemv)
    # Prompt lengths just below page boundaries (64, 128), so the decode crosses them.
    prompts = [_tokens(20 + lane, 60 + 17 * lane) for lane in range(batch)]
    eager = _decode(artifact, monkeypatch, False, prompts, 40)
    before = _core.cuda_graph_replays()
    graph = _decode(artifact, monkeypatch, True, prompts, 40)
    # Per signature the first step runs eagerly and the second is captured; a signature
    # changes only when a lane's page count crosses a power of two.
    assert _core.cuda_graph_replays() - before >= 30
    assert np.all(np.isfinite(eager))
    assert np.array_equal(graph, eager), f"max |diff| {np.abs(graph - eager).max():.3e}"


def test_graph_batched_equals_alone(artifact, monkeypatch):
    """Lanes decoded together under graphs equal each lane decoded alone under graphs, within
    float32 rounding: the split-KV count depends on the batch size, so attention sums in a
    different order (MoE: a near-tie in routing could flip, hence the loose bound)."""
    prompts = [_tokens(40 + lane, 50 + 20 * lane) for lane in range(4)]
    together = _decode(artifact, monkeypatch, True, prompts, 24)
    for lane, ids in enumerate(prompts):
        monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")
        monkeypatch.setenv("NINFER_CUDA_GRAPHS", "1")
        runner = _core.ModelRunner(str(artifact), max_lanes=4, max_batch_tokens=256,
                                   max_context=512, device="cuda")
        runner.forward(lane, 0, ids)
        feed = _tokens(99, 25)
        alone = np.stack([runner.forward_batch([(lane, len(ids) + i, [feed[i] + lane])])[0]
                          for i in range(24)])
        ref = together[:, lane]
        err = float(np.linalg.norm(alone - ref) / np.linalg.norm(ref))
        assert err < 1e-2, f"lane {lane}: batched vs alone rel err {err:.2e}"
