"""The Responses endpoint over the real engine: a random-weight Qwen3.5-style hybrid model on
the CPU backend (synthetic tokenizer, the artifact's Qwen template). The text is noise; what
is checked is the contract: greedy aggregate and stream agree Item for Item, deltas build the
terminal Items, usage matches the input-token count, and a chain renders its history."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from ninfer.engine_types import EngineConfig
from server_harness import start_server

_core = pytest.importorskip("ninfer._core")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny-hybrid"
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=64,
    intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, vocab_size=400, mtp_num_hidden_layers=0,
)  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_random_artifact(
        CONFIG,
        tmp_path_factory.mktemp("art") / "hybrid.ninfer",
        seed=5,
        tokenizer="synthetic",
        name=MODEL,
    )
    config = EngineConfig(
        device="cpu", max_concurrency=2, max_context=1024, prefill_chunk=64, threads=1
    )
    running = start_server(AsyncEngine.open(path, config), default_max_tokens=16)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def _without_ids(items):
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def test_stream_and_aggregate_agree(server, client):
    request = {
        "model": MODEL,
        "input": "Count to three.",
        "temperature": 0,
        "max_output_tokens": 12,
    }
    aggregate = client.responses.create(**request)
    assert aggregate.usage.output_tokens <= 12
    raw = httpx.post(server.base_url + "/v1/responses", json=request, timeout=60).json()
    with httpx.stream(
        "POST", server.base_url + "/v1/responses", json={**request, "stream": True}, timeout=60
    ) as reply:
        frames = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    final = frames[-1]["response"]
    assert final["status"] == aggregate.status
    assert _without_ids(final["output"]) == _without_ids(raw["output"])
    assert final["usage"] == raw["usage"]
    assert raw["usage"]["output_tokens"] == aggregate.usage.output_tokens
    reasoning = "".join(f["delta"] for f in frames if f["type"] == "response.reasoning_text.delta")
    text = "".join(f["delta"] for f in frames if f["type"] == "response.output_text.delta")
    for item in final["output"]:
        if item["type"] == "reasoning":
            assert item["content"][0]["text"] == reasoning
        if item["type"] == "message":
            assert item["content"][0]["text"] == text


def test_chain_usage_matches_input_token_count(client):
    first = client.responses.create(model=MODEL, input="Hello.", max_output_tokens=6)
    count = client.responses.input_tokens.count(
        model=MODEL, input="And again.", previous_response_id=first.id
    )
    second = client.responses.create(
        model=MODEL, input="And again.", previous_response_id=first.id, max_output_tokens=6
    )
    assert second.usage.input_tokens == count.input_tokens > first.usage.input_tokens
