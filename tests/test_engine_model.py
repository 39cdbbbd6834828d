"""The engine over a real (random-weight) Llama artifact: batching and chunking invariance,
AsyncEngine.open metadata, and the token byte table."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from ninfer import _core
from ninfer.artifact import read_header
from ninfer.convert.random import make_random_artifact
from ninfer.engine import AsyncEngine, core_options
from ninfer.engine_types import EngineConfig, GenerationRequest, SamplingParams
from ninfer.tokenizer import Tokenizer
from toy_engine import collect, run_one, submit_ok

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "max_position_embeddings": 1024,
}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_artifact(
        LLAMA, tmp_path_factory.mktemp("engine") / "llama.ninfer", seed=11, dtype="f32"
    )


def _core_engine(artifact: Path, **config) -> object:
    cfg = EngineConfig(**({"max_context": 256, "threads": 1} | config))
    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    return _core.Engine.open(str(artifact), core_options(cfg, []), table, threads=cfg.threads)


def _requests() -> list[tuple[list[int], int, dict]]:
    rng = random.Random(3)
    out = []
    for i in range(8):
        prompt = [rng.randrange(512) for _ in range(rng.randrange(1, 80))]
        sampling = {"temperature": 0.0} if i < 6 else {"temperature": 1.0, "seed": i}
        out.append((prompt, 12, sampling | {"ignore_eos": True}))
    return out


def _signature(outcome) -> tuple:
    return outcome.tokens, outcome.text, outcome.final.finish_reason


def test_eight_concurrent_requests_match_each_alone(artifact: Path) -> None:
    requests = _requests()
    alone_engine = _core_engine(artifact, max_concurrency=1, prefill_chunk=512)
    alone = [_signature(run_one(alone_engine, p, n, **kw)) for p, n, kw in requests]
    alone_engine.shutdown()

    engine = _core_engine(artifact, max_concurrency=8, prefill_chunk=32)
    ids = [submit_ok(engine, p, n, **kw) for p, n, kw in requests]
    got = collect(engine, ids, timeout=60)
    stats = engine.stats()
    engine.shutdown()
    assert [_signature(got[i]) for i in ids] == alone
    assert all(len(tokens) == 12 for tokens, _, _ in alone)
    assert len({tuple(tokens) for tokens, _, _ in alone}) > 4  # the prompts lead apart
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
    assert stats["decode_rows"] > stats["steps"]  # rows really were batched


def test_async_engine_open_reports_the_artifact(artifact: Path) -> None:
    async def main():
        engine = AsyncEngine.open(artifact, EngineConfig(max_concurrency=2, max_context=0))
        await engine.warmup()
        prompt = engine.tokenizer.encode("Hello world")
        handle = engine.submit(
            GenerationRequest(prompt, 5, SamplingParams(temperature=0.0), ignore_eos=True)
        )
        events = [e async for e in handle]
        await engine.close()
        return engine, prompt, events

    engine, prompt, events = asyncio.run(main())
    info = engine.model_info
    assert info["n_ctx"] == engine.max_context == 1024 == info["n_ctx_train"]
    assert info["n_vocab"] == 512 and info["n_embd"] == 64
    assert info["architecture"] == "llama" and info["n_params"] > 0 and info["size"] > 0
    assert engine.header["architecture"] == "llama"
    assert engine.chat_template() and "im_start" in engine.chat_template()
    tokens = [t for e in events for t in e.token_ids]
    assert len(tokens) == 5 and events[-1].finish_reason == "length"
    text = b"".join(e.text for e in events)
    # Rows past the tokenizer's vocabulary (the model's padding) stand for no bytes.
    table = engine.tokenizer.token_bytes()
    assert text == b"".join(table[t] if t < len(table) else b"" for t in tokens)
    assert events[-1].prompt_tokens == len(prompt)
