"""Anthropic Messages through the official anthropic SDK against a live loopback server.

The fake engine serves the Qwen3.5/3.6 template (prompts end with the reasoning opener, tools
render in the Qwen format) and answers scripted raw text, one byte-token per event, so every
expected value follows from the script: "You said: <last user text>." otherwise.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import anthropic
import httpx
import pytest

from fake_engine import FakeEngine
from ninfer.engine_types import EngineConfig
from ninfer.prompt.builtin_templates import builtin_template
from ninfer.server.config import AppConfig
from server_harness import start_server

KEY = "sk-local-test"
QWEN = builtin_template("qwen3_5")
REASONED = "Let me think.\n</think>\n\nThe answer is 4."
WEATHER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
CLOCK_CALL = "<tool_call>\n<function=clock>\n</function>\n</tool_call>"
SCRIPT = {
    "reason": REASONED,
    "weather": "I should look it up.\n</think>\n\n" + WEATHER_CALL,
    "two calls": "Both.\n</think>\n\n" + WEATHER_CALL + "\n" + CLOCK_CALL,
    "plain": "Just an answer.",
}
WEATHER = {
    "name": "get_weather",
    "description": "Weather forecast",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
CLOCK = {"name": "clock", "input_schema": {"type": "object", "properties": {}}}
NO_THINKING = {"type": "disabled"}
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "agents"
if not FIXTURES.is_dir():
    FIXTURES = Path("/work/shared/fixtures/agents")
CLAUDE_CODE = FIXTURES / "claude-code-turn3-write-bash.json"


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(EngineConfig(max_concurrency=4, max_pending_requests=8), max_context=32768)
    engine.scripted.update(SCRIPT)
    running = start_server(
        engine, AppConfig(api_key=KEY, keep_alive_s=0.3), chat_template=QWEN, default_max_tokens=77
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)


def user(text):
    return [{"role": "user", "content": text}]


def create(client, text=None, **kw):
    kw.setdefault("model", "any-local-label")
    kw.setdefault("max_tokens", 200)
    kw.setdefault("messages", user(text))
    return client.messages.create(**kw)


def count(client, **kw):
    kw.setdefault("model", "m")
    return client.messages.count_tokens(**kw).input_tokens


def last_prompt(server) -> str:
    return server.engine.tokenizer.decode(server.engine.requests[-1].prompt_ids)


def comparable(message) -> dict:
    """A message without its random ids (message id, tool_use ids)."""
    body = message.model_dump(exclude_none=True)
    body.pop("id")
    for block in body["content"]:
        block.pop("id", None)
        block.pop("parsed_output", None)
    return body


def b64(text: str) -> str:
    return "ninfer-reasoning.v1:" + base64.b64encode(text.encode()).decode()


# ---- aggregate, stream, thinking ----------------------------------------------------------


def test_aggregate_thinking_text_and_usage(client):
    reply = client.messages.with_raw_response.create(
        model="any-local-label", max_tokens=200, messages=user("reason")
    )
    assert reply.headers["request-id"].startswith("req_")
    assert "x-request-id" not in reply.headers
    message = reply.parse()
    assert message.model == "any-local-label"
    assert message.id.startswith("msg_")
    thinking, text = message.content
    assert (thinking.type, thinking.thinking) == ("thinking", "Let me think.")
    assert thinking.signature == b64("Let me think.")
    assert (text.type, text.text) == ("text", "The answer is 4.")
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert message.usage.input_tokens == count(client, messages=user("reason"))
    assert message.usage.output_tokens == len(REASONED.encode()) + 1  # + the withheld eos
    assert message.usage.output_tokens_details.thinking_tokens == len(b"Let me think.\n</think>")
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens is None


def test_stream_final_message_equals_aggregate(client):
    sampling = {"temperature": 0, "top_k": 1}  # this SDK sends sampling fields as extra_body
    aggregate = create(client, "reason", extra_body=sampling)
    with client.messages.stream(
        model="any-local-label", max_tokens=200, messages=user("reason"), extra_body=sampling
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert comparable(final) == comparable(aggregate)
    kinds = [e.type for e in events if e.type in ("message_start", "message_delta", "message_stop")]
    assert kinds == ["message_start", "message_delta", "message_stop"]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas[0] == "thinking_delta"
    assert deltas.index("signature_delta") < deltas.index("text_delta")
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert events[0].message.usage.input_tokens == aggregate.usage.input_tokens


def test_display_omitted_sends_only_the_signature(client):
    thinking = {"type": "adaptive", "display": "omitted"}
    message = create(client, "reason", thinking=thinking)
    assert message.content[0].thinking == ""
    assert message.content[0].signature == b64("Let me think.")
    with client.messages.stream(
        model="any-local-label", max_tokens=200, messages=user("reason"), thinking=thinking
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" not in deltas and "signature_delta" in deltas
    assert comparable(final) == comparable(message)


def test_enabled_thinking_budget_at_or_above_max_tokens_is_accepted(client):
    thinking = {"type": "enabled", "budget_tokens": 4096}
    message = create(client, "reason", max_tokens=1024, thinking=thinking)
    assert message.content[-1].text == "The answer is 4."


# ---- prompt shape: system forms, joining, prefill --------------------------------------


def test_system_string_and_blocks_render_the_same(server, client):
    create(client, "plain", system="Be brief. Be exact.", thinking=NO_THINKING)
    as_string = last_prompt(server)
    blocks = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Be exact."}]
    create(client, "plain", system=blocks, thinking=NO_THINKING)
    assert last_prompt(server) == as_string
    assert "<|im_start|>system\nBe brief. Be exact.<|im_end|>" in as_string


def test_billing_header_block_is_consumed_only_in_first_position(client):
    header = "x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=cli;"
    rest = {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}
    billing = {"type": "text", "text": header, "cache_control": {"type": "ephemeral"}}
    plain = count(client, messages=user("hi"), system=[rest])
    assert count(client, messages=user("hi"), system=[billing, rest]) == plain
    assert count(client, messages=user("hi"), system=[rest, billing]) > plain
    assert count(client, messages=user("hi"), system=header + "\nYou are an agent.") > plain


def test_consecutive_messages_join_and_system_keeps_its_place(server, client):
    messages = [
        {"role": "user", "content": "pla"},
        {"role": "user", "content": [{"type": "text", "text": "in"}]},
    ]
    assert create(client, messages=messages, thinking=NO_THINKING).content[0].text == (
        "Just an answer."
    )
    messages = [
        {"role": "user", "content": "first"},
        {"role": "system", "content": [{"type": "text", "text": "Mid rule."}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "plain"},
    ]
    create(client, messages=messages, thinking=NO_THINKING)
    prompt = last_prompt(server)
    order = [prompt.index(s) for s in ("user\nfirst", "system\nMid rule.", "assistant\nok")]
    assert order == sorted(order)


def test_final_assistant_message_is_a_prefill(server, client):
    messages = [
        {"role": "user", "content": "plain"},
        {"role": "assistant", "content": "Well:"},
    ]
    message = create(client, messages=messages, thinking=NO_THINKING)
    assert last_prompt(server).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nWell:")
    assert message.content[0].text == "Just an answer."
    with pytest.raises(anthropic.BadRequestError) as info:
        create(client, messages=messages)
    assert info.value.body["error"]["code"] == "invalid_prompt"


def test_count_tokens_follows_the_prompt(server, client):
    messages = user("plain")
    create(client, messages=messages, thinking=NO_THINKING)
    sent = len(server.engine.requests[-1].prompt_ids)
    assert count(client, messages=messages, thinking=NO_THINKING) == sent
    longer = [*messages, {"role": "assistant", "content": "ok"}, *user("more")]
    assert count(client, messages=longer, thinking=NO_THINKING) > sent
    assert count(client, messages=messages, thinking=NO_THINKING, tools=[WEATHER]) > sent
    # Output-only fields do not change the count.
    body = {"model": "m", "messages": messages, "thinking": NO_THINKING, "max_tokens": 5}
    reply = httpx.post(
        server.base_url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": KEY}
    )
    assert reply.json() == {"input_tokens": sent}


def test_default_max_tokens_when_omitted(server):
    body = {"model": "m", "messages": user("plain"), "thinking": NO_THINKING}
    reply = httpx.post(server.base_url + "/v1/messages", json=body, headers={"x-api-key": KEY})
    assert reply.status_code == 200, reply.text
    assert server.engine.requests[-1].max_tokens == 77


# ---- stops ----------------------------------------------------------------------------


def test_stop_sequence(client):
    message = create(client, "plain", thinking=NO_THINKING, stop_sequences=["an", "zz"])
    assert message.content[0].text == "Just "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "an")


def test_max_tokens_stop(client):
    message = create(client, "plain", thinking=NO_THINKING, max_tokens=5)
    assert message.content[0].text == "Just "
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5


# ---- tools ----------------------------------------------------------------------------


def test_tool_use_aggregate_and_stream(client):
    message = create(client, "weather", tools=[WEATHER])
    thinking, call = message.content
    assert thinking.thinking == "I should look it up."
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert call.name == "get_weather"
    assert call.input == {"city": "Paris", "days": 3}
    assert list(call.input) == ["city", "days"]
    assert message.stop_reason == "tool_use"
    with client.messages.stream(
        model="any-local-label", max_tokens=200, messages=user("weather"), tools=[WEATHER]
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas
    assert comparable(final) == comparable(message)


def test_tool_choice_none_and_single_call(client):
    message = create(client, "weather", tools=[WEATHER], tool_choice={"type": "none"})
    assert message.stop_reason == "end_turn"
    assert "<tool_call>" in message.content[-1].text
    both = create(client, "two calls", tools=[WEATHER, CLOCK])
    assert [b.name for b in both.content if b.type == "tool_use"] == ["get_weather", "clock"]
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    one = create(client, "two calls", tools=[WEATHER, CLOCK], tool_choice=choice)
    assert [b.name for b in one.content if b.type == "tool_use"] == ["get_weather"]


def _tool_turns(results):
    return [
        {"role": "user", "content": "plain"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "", "signature": b64("Two lookups.")},
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "get_weather",
                    "input": {"city": "A"},
                },
                {"type": "tool_use", "id": "toolu_b", "name": "clock", "input": {}},
            ],
        },
        {"role": "user", "content": results},
    ]


def test_tool_results_are_matched_by_id_and_rendered_in_call_order(server, client):
    a = {"type": "tool_result", "tool_use_id": "toolu_a", "content": "sunny"}
    b = {
        "type": "tool_result",
        "tool_use_id": "toolu_b",
        "content": [{"type": "text", "text": "noon"}],
    }
    create(client, messages=_tool_turns([a, b]), tools=[WEATHER, CLOCK])
    in_order = last_prompt(server)
    create(client, messages=_tool_turns([b, a]), tools=[WEATHER, CLOCK])
    assert last_prompt(server) == in_order
    assert in_order.index("sunny") < in_order.index("noon")
    assert "<think>\nTwo lookups.\n</think>" in in_order  # the signature restored the reasoning
    failed = {**b, "is_error": True}
    create(client, messages=_tool_turns([a, failed]), tools=[WEATHER, CLOCK])
    assert "<tool_response>\nError: noon\n</tool_response>" in last_prompt(server)


def test_input_examples_are_shown_with_the_tool(server, client):
    example = {"city": "Oslo", "days": 2}
    create(client, "plain", thinking=NO_THINKING, tools=[{**WEATHER, "input_examples": [example]}])
    assert '"input_examples": [{"city": "Oslo", "days": 2}]' in last_prompt(server)


def test_deferred_tools_and_tool_references_keep_the_client_working(server, client):
    deferred = {**WEATHER, "defer_loading": True}
    reference = {"type": "tool_reference", "tool_name": "get_weather"}
    results = [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": [reference]},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "noon"},
    ]
    create(client, messages=_tool_turns(results), tools=[deferred, CLOCK])
    prompt = last_prompt(server)
    assert '"name": "get_weather"' in prompt
    assert "<tool_response>\nget_weather\n</tool_response>" in prompt


# ---- errors ---------------------------------------------------------------------------

_TRAILING_CALL = [
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_x", "name": "clock", "input": {}}],
    },
]
_FIVE_MARKS = [
    {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(5)
]
BAD_REQUESTS = {
    "max_tokens zero": ({"max_tokens": 0}, "max_tokens", None),
    "empty model": ({"model": ""}, "model", None),
    "no messages": ({"messages": []}, "messages", None),
    "unknown role": ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", None),
    "temperature": ({"extra_body": {"temperature": 1.5}}, "temperature", None),
    "block type not a string": (
        {"messages": [{"role": "user", "content": [{"type": {"text": "x"}}]}]},
        "messages[0].content[0].type",
        None,
    ),
    "tool_result part type": (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [[]]}],
                }
            ]
        },
        "messages[0].content[0].content[0]",
        "invalid_type",
    ),
    "empty stop": ({"stop_sequences": [""]}, "stop_sequences[0]", None),
    "document block": (
        {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
        "messages[0].content[0].type",
        "unsupported_parameter",
    ),
    "search result": (
        {"messages": [{"role": "user", "content": [{"type": "search_result"}]}]},
        "messages[0].content[0].type",
        "unsupported_parameter",
    ),
    "image": (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ]
        },
        "messages[0].content[0].source",
        "vision_disabled",
    ),
    "trailing tool_use": ({"messages": _TRAILING_CALL}, "messages[1]", "invalid_tool_history"),
    "missing tool_result": (
        {"messages": [*_TRAILING_CALL, {"role": "user", "content": "no result"}]},
        "messages[2].content",
        "invalid_tool_history",
    ),
    "orphan tool_result": (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_q", "content": ""}],
                },
            ]
        },
        "messages[2].content",
        "invalid_tool_history",
    ),
    "small budget": (
        {"thinking": {"type": "enabled", "budget_tokens": 100}},
        "thinking.budget_tokens",
        None,
    ),
    "thinking type": ({"thinking": {"type": "sometimes"}}, "thinking.type", None),
    "thinking display": (
        {"thinking": {"type": "adaptive", "display": "loud"}},
        "thinking.display",
        None,
    ),
    "bad signature": (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "", "signature": "ninfer-reasoning.v1:%%"},
                        {"type": "text", "text": "ok"},
                    ],
                },
                {"role": "user", "content": "again"},
            ]
        },
        "messages[1].content[0].signature",
        "invalid_thinking_signature",
    ),
    "server tool": (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tools[0].type",
        "unsupported_parameter",
    ),
    "no input_schema": ({"tools": [{"name": "x"}]}, "tools[0].input_schema", None),
    "unknown tool choice": (
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
        "tool_choice.name",
        None,
    ),
    "cache ttl": (
        {
            "system": [
                {"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "9m"}}
            ]
        },
        "system[0].cache_control.ttl",
        None,
    ),
    "five breakpoints": (
        {"messages": [{"role": "user", "content": _FIVE_MARKS}]},
        "messages[0].content[4].cache_control",
        None,
    ),
    "request-level ttl conflict": (
        {
            "messages": [{"role": "user", "content": _FIVE_MARKS[:1]}],
            "extra_body": {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
        },
        "cache_control",
        None,
    ),
    "output format": (
        {"extra_body": {"output_config": {"format": {"type": "json_object"}}}},
        "output_config.format.type",
        "invalid_value",
    ),
    "mcp servers": (
        {"extra_body": {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}},
        "mcp_servers",
        "unsupported_parameter",
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_requests_get_field_specific_errors(client, case):
    fields, param, code = copy.deepcopy(BAD_REQUESTS[case])
    fields.setdefault("messages", user("hi"))
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.with_raw_response.create(
            model=fields.pop("model", "m"), max_tokens=fields.pop("max_tokens", 50), **fields
        )
    error = info.value
    assert error.status_code == 400
    assert error.body["type"] == "error"
    assert error.body["error"]["type"] == "invalid_request_error"
    assert error.body["error"]["param"] == param
    assert param in error.body["error"]["message"]
    if code is not None:
        assert error.body["error"]["code"] == code
    assert error.body["request_id"] == error.response.headers["request-id"]


def test_malformed_bodies(server):
    url, headers = server.base_url + "/v1/messages", {"x-api-key": KEY}
    reply = httpx.post(url, content=b"{not json", headers=headers)
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    reply = httpx.post(url, json={"model": "m"}, headers=headers)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "missing_required_parameter"
    reply = httpx.post(url + "/count_tokens", json={"model": "m", "messages": 3}, headers=headers)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "messages"


def test_authentication(server):
    bare = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        create(bare, "plain")
    assert info.value.body["error"]["type"] == "authentication_error"
    body = {"model": "m", "messages": user("plain"), "max_tokens": 20, "thinking": NO_THINKING}
    reply = httpx.post(
        server.base_url + "/v1/messages", json=body, headers={"authorization": f"Bearer {KEY}"}
    )
    assert reply.status_code == 200


def test_doubled_prefix_and_query_string(server):
    body = {"model": "m", "messages": user("plain"), "max_tokens": 20, "thinking": NO_THINKING}
    headers = {"x-api-key": KEY}
    for path in ("/v1/v1/messages?beta=true", "/v1/messages?beta=true"):
        reply = httpx.post(server.base_url + path, json=body, headers=headers)
        assert reply.status_code == 200, reply.text
        assert reply.headers["request-id"].startswith("req_")
    missing = httpx.post(server.base_url + "/v1/messages/batches", json={}, headers=headers)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    reply = httpx.post(
        server.base_url + "/v1/v1/messages/count_tokens?beta=true",
        json=body,
        headers=headers,
    )
    assert reply.json()["input_tokens"] > 0


def test_local_overload_is_529(server, client):
    server.engine.outstanding += 1000  # the fake engine now reports its capacity full
    try:
        with pytest.raises(anthropic.APIStatusError) as info:
            create(client, "plain")
    finally:
        server.engine.outstanding -= 1000
    assert info.value.status_code == 529
    assert info.value.body["error"]["type"] == "overloaded_error"


def test_failure_after_the_stream_started_is_an_error_event(server):
    body = {
        "model": "m",
        "messages": user("fail: now"),
        "max_tokens": 50,
        "thinking": NO_THINKING,
        "stream": True,
    }
    events = _sse(server, "/v1/messages", body, {"x-api-key": KEY})
    assert events[0][0] == "message_start"
    name, payload = events[-1]
    assert name == "error" and payload["type"] == "error"
    assert payload["error"]["type"] == "api_error"
    assert "message_stop" not in [n for n, _ in events]


def test_ping_while_idle(server):
    server.engine.slow_pause = 0.8
    try:
        body = {"model": "m", "messages": user("slow: x"), "max_tokens": 30, "stream": True}
        events = _sse(server, "/v1/messages", {**body, "thinking": NO_THINKING}, {"x-api-key": KEY})
    finally:
        server.engine.slow_pause = 0.0
    names = [n for n, _ in events]
    assert "ping" in names
    assert names[-1] == "message_stop"


# ---- a recorded Claude Code request ---------------------------------------------------


def _sse(server, path, body, headers):
    events = []
    with httpx.stream(
        "POST", server.base_url + path, json=body, headers=headers, timeout=30
    ) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                payload = json.loads(line[len("data: ") :])
                assert payload["type"] == name
                events.append((name, payload))
    return events


@pytest.mark.parametrize("display", [None, "omitted"])
def test_claude_code_turn_replays(server, display):
    fixture = json.loads(CLAUDE_CODE.read_text())
    body = fixture["body"]
    if display is not None:
        body["thinking"]["display"] = display
    path = fixture["endpoint"].split(" ", 1)[1]
    events = _sse(server, path, body, fixture["headers"])
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["model"] == body["model"]
    prompt = last_prompt(server)
    assert "x-anthropic-billing-header" not in prompt
    assert "<|im_start|>system\n# Environment" in prompt
    assert "A small config loader is wanted." in prompt  # restored from the echoed signature
    counted = httpx.post(
        server.base_url + "/v1/messages/count_tokens?beta=true",
        json=body,
        headers=fixture["headers"],
    )
    assert counted.json()["input_tokens"] == len(server.engine.requests[-1].prompt_ids)
    assert start["usage"]["input_tokens"] == counted.json()["input_tokens"]


def test_context_exhaustion_is_its_own_stop_reason(server, client):
    messages = user("plain")
    prompt = count(client, messages=messages, thinking=NO_THINKING)
    server.engine.max_context = prompt + 5
    try:
        message = create(client, messages=messages, thinking=NO_THINKING, max_tokens=100)
    finally:
        server.engine.max_context = 32768
    assert message.stop_reason == "model_context_window_exceeded"
    assert message.content[0].text == "Just "


def test_prefill_under_default_thinking_is_judged_by_the_server_default(client):
    messages = [{"role": "user", "content": "plain"}, {"role": "assistant", "content": "So"}]
    with pytest.raises(anthropic.BadRequestError) as info:
        create(client, messages=messages)  # this server thinks by default
    assert info.value.body["error"]["code"] == "invalid_prompt"
    assert info.value.body["error"]["param"] == "messages[1]"


def test_token_counts_have_their_own_capacity(server, client):
    gate = server.app.token_counts
    gate.capacity, capacity = 0, gate.capacity
    try:
        with pytest.raises(anthropic.APIStatusError) as info:
            count(client, messages=user("hi"))
    finally:
        gate.capacity = capacity
    assert info.value.status_code == 529
    assert info.value.body["error"]["type"] == "overloaded_error"


def test_engine_refusals_map_to_anthropic_categories():
    from ninfer.engine_types import EngineOverloaded, EngineUnavailable, QueueTimeout
    from ninfer.server.anthropic_errors import anthropic_error
    from ninfer.server.errors import from_engine_error

    expected = {
        EngineOverloaded("full"): (529, "overloaded_error"),
        QueueTimeout("late"): (504, "timeout_error"),
        EngineUnavailable("gone"): (503, "api_error"),
    }
    for exc, (status, kind) in expected.items():
        got_status, body = anthropic_error(from_engine_error(exc), "req_1")
        assert (got_status, body["error"]["type"]) == (status, kind)
        assert body["request_id"] == "req_1"
