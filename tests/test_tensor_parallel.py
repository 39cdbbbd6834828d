"""Tensor parallelism on the CPU: a tiny random model split over 2 and 4 ranks (threads of this
process, joined by the CPU collective group) gives the unsplit model's logits, through the
engine and through `ninfer-serve --device cpu --tensor-parallel-size N`.

The splits cover query heads (and KV heads, or one replicated KV head per rank when the group
outnumbers them), MLP columns/rows, the vocabulary-parallel LM head (and a vocabulary that does
not divide, which stays whole), q/k/v biases (Qwen2), per-head q/k norms and tied embeddings
(Qwen3), Gated DeltaNet key/value heads with their conv channels and recurrent state, gated
attention, and MoE experts, whole per rank or split by columns (Qwen3.5). Sums are
reassociated across ranks, so the comparison allows float32 rounding (measured: about 1e-7 of
the largest logit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

_core = pytest.importorskip("ninfer._core")

from ninfer.artifact import read_header  # noqa: E402
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine, core_options  # noqa: E402
from ninfer.engine_types import EngineConfig  # noqa: E402
from ninfer.server.cli import engine_config  # noqa: E402
from ninfer.server.options import parse_args  # noqa: E402
from ninfer.tokenizer import Tokenizer  # noqa: E402
from server_harness import free_port, start_server  # noqa: E402
from toy_engine import run_one  # noqa: E402

GREEDY = {"temperature": 0.0, "ignore_eos": True, "capture_logits": True}
LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
    intermediate_size=96, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
    vocab_size=512, max_position_embeddings=2048,
)  # fmt: skip
HYBRID = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=64,
    intermediate_size=96, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
    head_dim=16, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16,
    linear_value_head_dim=8, vocab_size=512, mtp_num_hidden_layers=0,
)  # fmt: skip
HYBRID_MOE = {
    key: value for key, value in HYBRID.items() if key != "intermediate_size"
} | dict(
    architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
    mtp_num_hidden_layers=1, vocab_size=510,
)  # fmt: skip
MODELS = {
    "llama": LLAMA,
    # 2 KV heads: over 4 ranks each keeps the one its 2 query heads read
    "llama_gqa": LLAMA | dict(num_key_value_heads=2),
    "qwen2_bias": LLAMA | dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2"),
    # qk norms, tied embeddings, and a vocabulary 4 does not divide (the LM head stays whole)
    "qwen3_tied": LLAMA | dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16,
        tie_word_embeddings=True, vocab_size=510,
    ),
    # Qwen3.5: Gated DeltaNet layers (key/value heads split) and gated attention, dense MLP
    "qwen3_5": HYBRID,
    # Qwen3.5 MoE: whole experts per rank (expert parallelism; routing whole on every rank),
    # the shared expert split like an MLP, an MTP head loaded split, a vocabulary 4 does not
    # divide
    "qwen3_5_moe": HYBRID_MOE,
    # 6 experts: whole experts over 2 ranks, every expert's columns split over 4
    "qwen3_5_moe_6": HYBRID_MOE | dict(num_experts=6),
}  # fmt: skip
PROMPT = [5, 17, 99, 3, 250, 7, 42, 8, 301, 12, 77, 1, 64, 200, 33, 9, 120, 45]


@pytest.fixture(scope="module", params=sorted(MODELS))
def artifact(request, tmp_path_factory) -> Path:
    return make_random_artifact(
        MODELS[request.param],
        tmp_path_factory.mktemp("tp") / f"{request.param}.ninfer",
        seed=5,
        dtype="f32",
        tokenizer="synthetic",
    )


def _engine(artifact: Path, tensor_parallel_size: int, **config):
    cfg = EngineConfig(max_context=256, threads=1, prefill_chunk=8, max_concurrency=2, **config)
    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    return _core.Engine.open(
        str(artifact),
        core_options(cfg, []),
        table,
        threads=4,
        tensor_parallel_size=tensor_parallel_size,
    )


def _logits(artifact: Path, tensor_parallel_size: int) -> np.ndarray:
    """Logits of every generated token: a prompt prefilled in chunks of 8, then decode."""
    engine = _engine(artifact, tensor_parallel_size)
    try:
        outcome = run_one(engine, PROMPT, 6, **GREEDY)
        return np.stack([e.logits for e in outcome.events if e.token_ids])
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def unsplit(artifact) -> np.ndarray:
    return _logits(artifact, 1)


@pytest.mark.parametrize("ranks", [2, 4])
def test_split_model_gives_the_unsplit_logits(artifact, unsplit, ranks):
    split = _logits(artifact, ranks)
    assert split.shape == unsplit.shape
    scale = np.abs(unsplit).max()
    np.testing.assert_allclose(split, unsplit, rtol=0, atol=2e-6 * scale)
    assert np.array_equal(split.argmax(-1), unsplit.argmax(-1))


def test_speculative_rounds_over_two_ranks_roll_back_every_rank(tmp_path):
    """N-gram rounds on a split Qwen3.5: a rejected proposal must roll the GDN state of every
    rank back (Model::keep_prefix reaches each rank), so the output is plain greedy decoding's."""
    path = make_random_artifact(
        HYBRID, tmp_path / "spec.ninfer", seed=5, dtype="f32", tokenizer="synthetic"
    )
    greedy = {"temperature": 0.0, "ignore_eos": True}
    plain_engine = _engine(path, 1)
    plain = run_one(plain_engine, PROMPT, 24, **greedy).tokens
    plain_engine.shutdown()
    # The oracle proposes the true continuation with every fifth token wrong.
    oracle = [(t + 1) % 512 if i % 5 == 3 else t for i, t in enumerate(plain)]
    engine = _engine(path, 2, ngram_draft_tokens=3)
    try:
        got = run_one(engine, PROMPT, 24, draft_oracle=oracle, **greedy).tokens
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == plain
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]


def test_mtp_with_tensor_parallel_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["m.ninfer", "-tp", "2", "--device", "cpu", "--spec", "mtp"])


def test_a_split_that_does_not_divide_is_refused(tmp_path):
    path = make_random_artifact(
        LLAMA | dict(num_attention_heads=6, num_key_value_heads=6, hidden_size=48),
        tmp_path / "six.ninfer", dtype="f32", tokenizer="synthetic",
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="size 4 must divide num_key_value_heads"):
        _engine(path, 4)


def test_gdn_heads_that_do_not_divide_are_refused(tmp_path):
    path = make_random_artifact(
        HYBRID | dict(linear_num_key_heads=2, linear_num_value_heads=4),
        tmp_path / "h.ninfer", dtype="f32", tokenizer="synthetic",
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="size 4 must divide linear_num_key_heads"):
        _engine(path, 4)


def test_the_flag_needs_the_cpu_device():
    with pytest.raises(SystemExit):
        parse_args(["m.ninfer", "--tensor-parallel-size", "2", "--device", "0"])
    args = parse_args(["m.ninfer", "--tensor-parallel-size", "2", "--device", "cpu"])
    assert args.tensor_parallel_size == 2
    assert parse_args(["m.ninfer", "-tp", "4", "--device", "cpu"]).tensor_parallel_size == 4
    with pytest.raises(SystemExit):
        parse_args(["m.ninfer", "-tp", "2", "--device", "cpu", "--prefix-cache-file", "c.bin"])


@pytest.mark.parametrize("model", ["llama", "qwen3_5"])
def test_served_over_two_ranks_like_one(tmp_path, model):
    """`ninfer-serve --device cpu --tensor-parallel-size 2` (its option parsing and engine
    config) answers a greedy chat request with the unsplit server's 16 tokens, and a repeat
    of it from the prefix cache (KV pages, and for Qwen3.5 the GDN state snapshots, of every
    rank) with the same tokens again."""
    path = make_random_artifact(
        MODELS[model], tmp_path / "s.ninfer", seed=9, dtype="f32", tokenizer="synthetic",
        name="tiny",
    )  # fmt: skip
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "split me over ranks " * 8}],
        "max_tokens": 16, "temperature": 0, "ignore_eos": True,
    }  # fmt: skip
    contents = []
    for ranks in (1, 2):
        args = parse_args(
            [str(path), "--device", "cpu", "--tensor-parallel-size", str(ranks),
             "--max-context", "512", "--prefill-chunk", "64"]
        )  # fmt: skip
        config = engine_config(args)
        assert config.tensor_parallel_size == ranks
        config.threads = 2
        running = start_server(AsyncEngine.open(str(path), config), model_id="tiny")
        try:
            for attempt in range(2):
                url = running.base_url + "/v1/chat/completions"
                reply = httpx.post(url, json=body, timeout=60)
                assert reply.status_code == 200, reply.text
                choice, usage = reply.json()["choices"][0], reply.json()["usage"]
                assert choice["finish_reason"] == "length"
                if attempt == 1:
                    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
                contents.append(choice["message"]["content"])
        finally:
            running.stop()
    assert len(set(contents)) == 1, contents


def test_the_ninfer_serve_process_over_two_ranks(tmp_path):
    """The real `ninfer-serve MODEL --device cpu -tp 2` process: it says so at startup and
    answers the same greedy tokens as the in-process unsplit engine."""
    path = make_random_artifact(
        MODELS["llama"], tmp_path / "p.ninfer", seed=9, dtype="f32", tokenizer="synthetic",
        name="tiny",
    )  # fmt: skip
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "one process, two ranks"}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": True,
    }  # fmt: skip
    running = start_server(
        AsyncEngine.open(str(path), EngineConfig(max_context=512, threads=1)), model_id="tiny"
    )
    try:
        reply = httpx.post(running.base_url + "/v1/chat/completions", json=body, timeout=60)
        expected = reply.json()["choices"][0]["message"]["content"]
    finally:
        running.stop()
    port = free_port()
    # This process's import path: the ninfer it imported (a source tree with the built
    # extension linked in, or the installed package) is the one the server runs.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [
        sys.executable, "-c", "import sys; from ninfer.server.cli import main; sys.exit(main())",
        str(path), "--device", "cpu", "-tp", "2", "--port", str(port), "--max-context", "512",
        "--model-id", "tiny", "--log-stats-interval-ms", "0",
    ]  # fmt: skip
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as server:
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "ninfer-serve did not become ready"
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"] == expected
        finally:
            server.send_signal(signal.SIGTERM)
            _, log_text = server.communicate(timeout=30)
    assert "tensor parallel: the model split over 2 ranks" in log_text
