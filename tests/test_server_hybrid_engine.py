"""The HTTP server over a Qwen3.5-style hybrid (GDN + gated attention) random model, on the CPU
and on the CUDA backend: what an API user sees must not depend on batching, streaming, or a
cancelled neighbour, and a seed must reproduce a sampled completion.

The CPU case runs in CI; the CUDA case is marked `gpu` (tools/gpu/check.sh). Plain httpx, so
that the GPU machine needs no OpenAI SDK.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from metrics_scrape import scrape
from ninfer.engine_types import EngineConfig
from server_harness import start_server

_core = pytest.importorskip("ninfer._core")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny-hybrid"
# Head dims the CUDA kernels take (attention 64; GDN key 64, value 32); 3 GDN layers and one
# gated-attention layer, as in the real models' 3:1 pattern.
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=128,
    intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
    linear_value_head_dim=32, vocab_size=400, mtp_num_hidden_layers=0,
)
PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "What is the capital of France? Answer in one word, please.",
    "Say something long enough to span more than one prefill chunk of thirty-two tokens, "
    "so that chunked prefill and decode interleave in the same step.",
]


def _cuda_available() -> bool:
    return _core.cuda_device_count() > 0


@pytest.fixture(
    scope="module",
    params=[
        "cpu",
        pytest.param(
            "cuda:0",
            marks=[pytest.mark.gpu,
                   pytest.mark.skipif(not _cuda_available(), reason="no CUDA device")],
        ),
    ],
)
def server(request, tmp_path_factory):
    path = make_random_artifact(CONFIG, tmp_path_factory.mktemp("art") / "hybrid.ninfer",
                                seed=3, tokenizer="synthetic", name=MODEL)
    # An explicit KV pool: auto would keep most of the card for the rest of the process.
    config = EngineConfig(device=request.param, max_concurrency=4, max_context=512,
                          prefill_chunk=32, max_pending_requests=8, threads=1, kv_capacity=4 * 512)
    running = start_server(AsyncEngine.open(path, config), default_max_tokens=24)
    yield running
    running.stop()


def _body(prompt: str, **fields) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    body.update(fields)
    return body


def _chat(server, prompt: str, **fields) -> dict:
    r = httpx.post(server.base_url + "/v1/chat/completions", json=_body(prompt, **fields),
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(server, prompt: str, **fields) -> tuple[str, dict]:
    body = _body(prompt, stream=True, stream_options={"include_usage": True}, **fields)
    text, usage = [], None
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body,
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
    return "".join(text), usage


def test_stream_equals_aggregate(server):
    whole = _chat(server, PROMPTS[0])
    text, usage = _stream(server, PROMPTS[0])
    assert whole["choices"][0]["message"]["content"] == text
    assert whole["usage"] == usage
    assert usage["completion_tokens"] == 20
    assert whole["choices"][0]["finish_reason"] == "length"


def test_concurrent_requests_equal_each_alone(server):
    alone = [_chat(server, p)["choices"][0]["message"]["content"] for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _chat(server, p)["choices"][0]["message"]["content"],
                                 PROMPTS))
    assert together == alone


def test_seed_reproduces_a_sampled_completion(server):
    fields = dict(temperature=0.9, top_p=0.95, top_k=20, seed=1234, max_tokens=24)
    first = _chat(server, PROMPTS[1], **fields)["choices"][0]["message"]["content"]
    # The same request again, now batched beside other work.
    with ThreadPoolExecutor(3) as pool:
        others = [pool.submit(_chat, server, p) for p in PROMPTS[2:]]
        again = _chat(server, PROMPTS[1], **fields)["choices"][0]["message"]["content"]
        for f in others:
            f.result()
    assert again == first


def test_cancelled_stream_leaves_no_trace(server):
    before = _chat(server, PROMPTS[3])["choices"][0]["message"]["content"]
    body = _body(PROMPTS[2], stream=True, max_tokens=200)
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body,
                      timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # hang up after the first event
    after = _chat(server, PROMPTS[3])["choices"][0]["message"]["content"]
    assert after == before


def test_metrics_report_the_hybrid_state_slots_and_tokens(server):
    before = scrape(server.base_url)
    usage = _chat(server, PROMPTS[0], max_tokens=7)["usage"]
    after = scrape(server.base_url)
    cache = server.engine.stats()["prefix_cache"]  # idle: nothing changes it meanwhile
    # One image per lane plus the prefix cache's snapshot slots; only snapshots are held now.
    assert after.value("ninfer_device_state_capacity_slots") == 4 + cache["snapshot_slots"]
    assert cache["snapshot_slots"] > 0
    assert after.value("ninfer_device_state_used_slots") == cache["snapshots"]
    grown = after.value("ninfer_generation_tokens_total") - before.value(
        "ninfer_generation_tokens_total"
    )
    assert grown == usage["completion_tokens"] == 7
    prompt = after.value("ninfer_prompt_tokens_total") - before.value("ninfer_prompt_tokens_total")
    assert prompt == usage["prompt_tokens"]
