"""A multi-turn chat through the HTTP server reuses its history: the second turn reports the
exact reused prefix in usage.prompt_tokens_details.cached_tokens, timings.cache_n and the
first prompt_progress event, for a dense Llama and a Qwen3.5 hybrid random model. /v1/models
reports the resolved KV capacity.

The CPU cases run in CI; the CUDA cases are marked `gpu` (tools/gpu/check.sh).
"""

from __future__ import annotations

import json

import httpx
import pytest

from metrics_scrape import scrape
from ninfer.engine_types import EngineConfig
from server_harness import start_server

_core = pytest.importorskip("ninfer._core")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny"
HYBRID = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=128,
    intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
    linear_value_head_dim=32, vocab_size=400, mtp_num_hidden_layers=0,
)  # fmt: skip
LLAMA = dict(
    architectures=["LlamaForCausalLM"], hidden_size=256, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=400,
    rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=2048,
)  # fmt: skip
SYSTEM = (
    "You are a careful assistant working in a repository. Read the tool results closely, "
    "answer in short sentences, and never invent file names or line numbers that you have "
    "not seen in the conversation so far. Keep answers under fifty words."
)


def _cuda_available() -> bool:
    return _core.cuda_device_count() > 0


_GPU = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_available(), reason="no CUDA device")]


@pytest.fixture(
    scope="module",
    params=[
        ("hybrid", "cpu"),
        ("llama", "cpu"),
        pytest.param(("hybrid", "cuda:0"), marks=_GPU),
        pytest.param(("llama", "cuda:0"), marks=_GPU),
    ],
    ids=lambda p: "-".join(p),
)
def server(request, tmp_path_factory):
    arch, device = request.param
    path = make_random_artifact(
        HYBRID if arch == "hybrid" else LLAMA,
        tmp_path_factory.mktemp("art") / f"{arch}.ninfer",
        seed=3,
        dtype="f32" if device == "cpu" else "bf16",
        tokenizer="synthetic",
        name=MODEL,
    )
    # On the GPU an explicit pool: auto would keep most of the card for the rest of the
    # process (the embedded server may hold its engine until exit).
    config = EngineConfig(
        device=device,
        max_concurrency=2,
        max_context=1024,
        prefill_chunk=64,
        threads=1,
        kv_capacity=0 if device == "cpu" else 16384,
    )
    running = start_server(AsyncEngine.open(path, config), default_max_tokens=24)
    running.arch = arch
    yield running
    running.stop()


def _chat(server, messages: list[dict], **fields) -> dict:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    } | fields
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _expected_reuse(server, first: dict, second_prompt: list[int]) -> int:
    """The reuse the cache's rules promise for turn 2, from turn 1's token ids."""
    prompt1 = first["prompt_token_ids"]
    output1 = first["choices"][0]["token_ids"]
    forwarded = prompt1 + output1[:-1]  # the last sampled token never ran through the model
    limit = min(_common(forwarded, second_prompt), len(second_prompt) - 1)
    if server.arch == "llama":  # dense: every whole cached block
        return limit // 64 * 64
    # Hybrid: the deepest state snapshot inside the common prefix: the implicit hint (the end
    # of the latest message), the prompt-end tap or the answer's latest decode endpoint.
    end = server.engine.tokenizer.token_to_id("<|im_end|>")
    hint = max(i for i, t in enumerate(prompt1) if t == end)
    snapshots = {hint // 64 * 64, len(prompt1) // 64 * 64, len(forwarded) // 64 * 64}
    return max((s for s in snapshots if s <= limit), default=0)


def test_second_turn_reports_the_reused_prefix(server):
    turn1 = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "List the files of the project and say what each does."},
    ]
    first = _chat(server, turn1)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["timings"]["cache_n"] == 0
    answer = first["choices"][0]["message"]["content"]
    turn2 = turn1 + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Now explain the second one in more detail, please."},
    ]
    second = _chat(server, turn2)
    usage, timings = second["usage"], second["timings"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    expected = _expected_reuse(server, first, second["prompt_token_ids"])
    assert expected >= 64  # the system prompt and first turn span whole blocks
    assert cached == expected
    assert timings["cache_n"] == cached
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    # The engine's counter behind /metrics saw the same reuse.
    reused = scrape(server.base_url).value("ninfer_prompt_tokens_cached_total")
    assert reused >= cached

    # The same turn streamed: the first progress event starts at the cache.
    body = {
        "model": MODEL,
        "messages": turn2,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "return_progress": True,
        "stream_options": {"include_usage": True},
    }
    progress, usage_chunk = [], None
    with httpx.stream(
        "POST", server.base_url + "/v1/chat/completions", json=body, timeout=120
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "prompt_progress" in chunk:
                    progress.append(chunk["prompt_progress"])
                if chunk.get("usage"):
                    usage_chunk = chunk["usage"]
    # Turn 2 itself was published, so this repeat reuses at least as much.
    reused = usage_chunk["prompt_tokens_details"]["cached_tokens"]
    assert reused >= cached
    assert progress[0]["cache"] == progress[0]["processed"] == reused
    assert progress[-1]["processed"] == progress[-1]["total"] == usage_chunk["prompt_tokens"]


def test_models_meta_reports_the_kv_capacity(server):
    card = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]
    assert card["meta"]["kv_capacity"] >= 1024
    assert card["meta"]["prefix_reuse"] is True
    assert card["max_model_len"] == 1024


def test_prompt_cache_options_are_checked(server):
    messages = [{"role": "user", "content": "hello"}]
    for options in ({"mode": "explicit"}, {"mode": "implicit"}, None):
        assert _chat(server, messages, max_tokens=2, prompt_cache_options=options)
    body = {"model": MODEL, "messages": messages, "prompt_cache_options": {"mode": "always"}}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt_cache_options.mode"


def test_anthropic_stream_reports_cache_reads_in_message_start(server):
    """Through the official SDK: the second turn's message_start already carries the exact
    cache read (admission fixed it), and the terminal usage agrees with it."""
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    system = "Messages session. " + SYSTEM  # shares no block with the other tests' prompts
    first = client.messages.create(
        model=MODEL,
        max_tokens=24,
        system=system,
        messages=[{"role": "user", "content": "List the files of the project, please."}],
        extra_body={"temperature": 0},
    )
    assert first.usage.cache_read_input_tokens == 0
    answer = "".join(b.text for b in first.content if b.type == "text") or "none"
    messages = [
        {"role": "user", "content": "List the files of the project, please."},
        {"role": "assistant", "content": answer},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "And the second one?",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    start = final = None
    with client.messages.stream(
        model=MODEL,
        max_tokens=8,
        system=system,
        messages=messages,
        extra_body={"temperature": 0},
    ) as stream:
        for event in stream:
            if event.type == "message_start":
                start = event.message.usage
        final = stream.get_final_message().usage
    assert start is not None and start.cache_read_input_tokens >= 64
    assert start.cache_read_input_tokens % 64 == 0
    assert final.cache_read_input_tokens == start.cache_read_input_tokens
    assert final.input_tokens == start.input_tokens
    assert start.cache_creation_input_tokens is None  # writes are not reported


def test_prompt_cache_breakpoints_become_exact_frontiers(server):
    from ninfer.protocols.openai_chat.lowering import lower_chat_request
    from ninfer.protocols.openai_chat.protocol import decode_request

    marked = {"type": "text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit"}}
    question = {"type": "text", "text": "Which file holds the tests?"}
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": [marked]},
            {"role": "user", "content": [question]},
        ],
    }
    served = server.app.served
    tokenizer = served.engine.tokenizer

    def lower(fields: dict) -> object:
        return lower_chat_request(decode_request(json.dumps(body | fields).encode()), served)

    explicit = lower({"prompt_cache_options": {"mode": "explicit"}}).generation
    frontier = explicit.cache_candidates
    assert len(frontier) == 1
    assert tokenizer.decode(explicit.prompt_ids[: frontier[0]]).endswith(SYSTEM)
    # The default adds the implicit candidate (end of the latest message) after it.
    default = lower({}).generation
    assert default.prompt_ids == explicit.prompt_ids
    assert default.cache_candidates[0] == frontier[0] and len(default.cache_candidates) == 2
    # Through HTTP: accepted, and a malformed marker names its field.
    assert _chat(server, body["messages"], max_tokens=2)
    bad = [{"role": "user", "content": [question | {"prompt_cache_breakpoint": True}]}]
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": bad},
        timeout=60,
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content[0].prompt_cache_breakpoint"


def test_responses_breakpoints_and_implicit_candidates(server):
    from ninfer.protocols.openai_responses.lowering import lower_create
    from ninfer.protocols.openai_responses.protocol import decode_create

    served = server.app.served
    tokenizer = served.engine.tokenizer
    marked = {"type": "input_text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit"}}
    body = {
        "model": MODEL,
        "store": False,
        "input": [
            {"role": "developer", "content": [marked]},
            {"role": "user", "content": [{"type": "input_text", "text": "Which file?"}]},
        ],
    }

    def lower(fields: dict) -> object:
        request = decode_create(json.dumps(body | fields).encode())
        return lower_create(request, served, server.app.response_store).generation

    explicit = lower({"prompt_cache_options": {"mode": "explicit"}})
    assert len(explicit.cache_candidates) == 1
    assert tokenizer.decode(explicit.prompt_ids[: explicit.cache_candidates[0]]).endswith(SYSTEM)
    default = lower({})
    assert default.prompt_ids == explicit.prompt_ids and len(default.cache_candidates) == 2
    r = httpx.post(server.base_url + "/v1/responses", json=body | {"max_output_tokens": 2})
    assert r.status_code == 200, r.text
