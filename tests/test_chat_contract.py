"""The Chat Completions contract through the openai SDK against a live server.

The fake engine serves the Qwen3.5/3.6 template (so prompts end with the reasoning opener
and tools render in the Qwen format) and replies with scripted raw text containing
`<think>`/`</think>` and `<tool_call>` markup, one byte-token per engine event. Every
expected value is derived independently from the scripted text.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from fake_engine import FakeEngine
from ninfer.engine_types import EngineConfig
from ninfer.prompt.builtin_templates import builtin_template
from server_harness import start_server

MODEL = "fake-chat"
QWEN = builtin_template("qwen3_5")

REASONED = "Let me think.\n</think>\n\nThe answer is 4."
WEATHER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
TOOL_REPLY = "I should look it up.\n</think>\n\n" + WEATHER_CALL
CUSTOM_REPLY = (
    "Run it.\n</think>\n\n<tool_call>\n<function=shell>\n<parameter=input>\nls -la\n"
    "</parameter>\n</function>\n</tool_call>"
)
BROKEN_REPLY = "ok\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"
PLAIN_REPLY = "Just an answer."
SCRIPT = {
    "reason": REASONED,
    "weather": TOOL_REPLY,
    "custom": CUSTOM_REPLY,
    "broken": BROKEN_REPLY,
    "plain": PLAIN_REPLY,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
SHELL_TOOL = {"type": "custom", "custom": {"name": "shell", "description": "Run a command"}}


def _engine(architecture: str = "llama") -> FakeEngine:
    engine = FakeEngine(EngineConfig(max_concurrency=4, max_pending_requests=8))
    engine.scripted.update(SCRIPT)
    engine.header["architecture"] = architecture
    return engine


@pytest.fixture(scope="module")
def server():
    running = start_server(_engine(), chat_template=QWEN)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def chat(client, text, **kwargs):
    messages = kwargs.pop("messages", [{"role": "user", "content": text}])
    return client.chat.completions.create(model=MODEL, messages=messages, **kwargs)


def tokens(text: str) -> int:
    return len(text.encode())  # the fake tokenizer: one token per byte


def tokenize_chat(server, messages, **extra) -> list[int]:
    reply = httpx.post(server.base_url + "/tokenize", json={"messages": messages, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


# ---- reasoning split and usage ---------------------------------------------------------


def test_reasoning_split_aggregate_and_usage(server, client):
    reply = chat(client, "reason")
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] == "Let me think."
    assert message.content == "The answer is 4."
    assert reply.choices[0].finish_reason == "stop"
    prompt = tokenize_chat(server, [{"role": "user", "content": "reason"}])
    assert server.engine.requests[-1].prompt_ids == prompt
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == tokens(REASONED) + 1  # + the withheld eos
    assert reply.usage.total_tokens == len(prompt) + tokens(REASONED) + 1
    # tokens fed while reasoning was open, through the closing marker
    assert reply.usage.completion_tokens_details.reasoning_tokens == tokens(
        "Let me think.\n</think>"
    )


def test_reasoning_split_stream(client):
    stream = chat(client, "reason", stream=True, stream_options={"include_usage": True})
    reasoning, content, order, usage = "", "", [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.model_extra.get("reasoning_content"):
                reasoning += delta.model_extra["reasoning_content"]
                order.append("r")
            if delta.content:
                content += delta.content
                order.append("c")
    assert (reasoning, content) == ("Let me think.", "The answer is 4.")
    assert order == sorted(order, key=lambda k: k != "r")  # reasoning never follows content
    assert usage.completion_tokens_details.reasoning_tokens == tokens("Let me think.\n</think>")
    assert usage.completion_tokens == tokens(REASONED) + 1


def test_thinking_disabled_gives_plain_content_and_instruct_prompt(server, client):
    reply = chat(client, "plain", extra_body={"enable_thinking": False})
    assert reply.choices[0].message.content == PLAIN_REPLY
    assert reply.choices[0].message.model_extra.get("reasoning_content") is None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0
    prompt = FakeEngine().tokenizer.decode(server.engine.requests[-1].prompt_ids)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # reasoning_effort none is the same switch
    chat(client, "plain", reasoning_effort="none")
    assert FakeEngine().tokenizer.decode(server.engine.requests[-1].prompt_ids) == prompt


def test_template_options_conflicts_and_reserved_keys(client):
    cases = [
        (
            {"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False}},
            "conflicting_template_option",
            "chat_template_kwargs.enable_thinking",
        ),
        (
            {"reasoning_effort": "none", "enable_thinking": True},
            "conflicting_template_option",
            "reasoning_effort",
        ),
        (
            {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}},
            "conflicting_template_option",
            "reasoning_effort",
        ),
        (
            {"chat_template_kwargs": {"messages": []}},
            "invalid_value",
            "chat_template_kwargs.messages",
        ),
        ({"chat_template_kwargs": {"tools": []}}, "invalid_value", "chat_template_kwargs.tools"),
        (
            {"chat_template_kwargs": {"eos_token": "x"}},
            "invalid_value",
            "chat_template_kwargs.eos_token",
        ),
    ]
    for extra, code, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            chat(client, "plain", extra_body=extra)
        assert (info.value.code, info.value.param) == (code, param), extra
    # agreeing duplicates and null standard options are fine
    chat(
        client,
        "plain",
        extra_body={"enable_thinking": False, "chat_template_kwargs": {"enable_thinking": False}},
    )
    chat(client, "plain", extra_body={"chat_template_kwargs": {"enable_thinking": None}})


def test_kwargs_owned_by_fields_or_jinja_are_dropped_and_auto_is_unset(server, client):
    messages = [{"role": "user", "content": "plain"}]
    plain = tokenize_chat(server, messages)
    ignored = {
        "add_generation_prompt": False,  # the request field wins
        "continue_final_message": True,
        "range": 3,  # Jinja built-ins the template needs
        "namespace": None,
        "tojson": "x",
        "equalto": 1,
        "enable_thinking": "auto",  # "auto" means unset, like null
        "preserve_thinking": "auto",
    }
    chat(client, "plain", extra_body={"chat_template_kwargs": ignored})
    assert server.engine.requests[-1].prompt_ids == plain
    assert tokenize_chat(server, messages, chat_template_kwargs=ignored) == plain


def test_preserve_thinking_keeps_history_reasoning(server, client):
    history = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one", "reasoning_content": "old thought"},
        {"role": "user", "content": "plain"},
    ]
    decode = FakeEngine().tokenizer.decode
    chat(client, None, messages=history)
    assert "old thought" not in decode(server.engine.requests[-1].prompt_ids)
    chat(client, None, messages=history, extra_body={"preserve_thinking": True})
    assert "<think>\nold thought\n</think>\n\none" in decode(server.engine.requests[-1].prompt_ids)
    # the `reasoning` alias is the same field
    aliased = [history[0], {**history[1], "reasoning": "old thought"}, history[2]]
    del aliased[1]["reasoning_content"]
    chat(
        client,
        None,
        messages=aliased,
        extra_body={"chat_template_kwargs": {"preserve_thinking": True}},
    )
    assert "<think>\nold thought\n</think>\n\none" in decode(server.engine.requests[-1].prompt_ids)


def test_prefill_continues_in_place_only_with_thinking_disabled(server, client):
    messages = [{"role": "user", "content": "plain"}, {"role": "assistant", "content": "Sure, "}]
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, None, messages=messages)
    assert (info.value.code, info.value.param) == ("invalid_prompt", "messages[1]")
    chat(client, None, messages=messages, extra_body={"enable_thinking": False})
    prompt = FakeEngine().tokenizer.decode(server.engine.requests[-1].prompt_ids)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nSure, ")


def test_control_token_spellings_in_content_are_text(server, client):
    chat(client, None, messages=[{"role": "user", "content": "plain <|im_end|> <|im_start|>"}])
    ids = server.engine.requests[-1].prompt_ids
    # the template's own turn markers only: user turn + generation prompt
    assert ids.count(1) == 2 and ids.count(2) == 1
    assert "plain <|im_end|> <|im_start|>" in FakeEngine().tokenizer.decode(ids)


# ---- tools ------------------------------------------------------------------------------


def test_tool_call_aggregate(server, client):
    reply = chat(client, "weather", tools=[WEATHER_TOOL])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"] == "I should look it up."
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert list(json.loads(call.function.arguments).items()) == [("city", "Paris"), ("days", 3)]
    assert reply.usage.completion_tokens == tokens(TOOL_REPLY) + 1
    prompt = FakeEngine().tokenizer.decode(server.engine.requests[-1].prompt_ids)
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in prompt  # member order as received


def test_tool_call_stream_is_terminal_and_complete(client):
    stream = chat(client, "weather", tools=[WEATHER_TOOL], stream=True)
    chunks = list(stream)
    calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(calls) == 1
    (delta,) = calls[0].choices[0].delta.tool_calls
    assert delta.index == 0 and delta.id.startswith("call_")
    assert json.loads(delta.function.arguments) == {"city": "Paris", "days": 3}
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in content
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert chunks.index(calls[0]) == len(chunks) - 2  # right before the finish chunk


def test_tool_choice_none_leaves_markup_as_content(client):
    reply = chat(client, "weather", tools=[WEATHER_TOOL], tool_choice="none")
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == WEATHER_CALL
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "choice",
    [
        "auto",
        "required",
        {"type": "function", "function": {"name": "get_weather"}},
        {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "auto",
                "tools": [{"type": "function", "function": {"name": "get_weather"}}],
            },
        },
    ],
)
def test_tool_choice_forms_parse_calls(client, choice):
    reply = chat(
        client, "weather", tools=[WEATHER_TOOL], tool_choice=choice, parallel_tool_calls=False
    )
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_errors(client):
    cases = [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required", "tools": None}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
    ]
    for extra, param in cases:
        body = {"tools": [WEATHER_TOOL], **extra}
        if body["tools"] is None:
            del body["tools"]
        with pytest.raises(openai.BadRequestError) as info:
            chat(client, "weather", extra_body=body)
        assert info.value.param == param


def test_custom_tool_served_as_one_string_function(server, client):
    reply = chat(client, "custom", tools=[SHELL_TOOL])
    (call,) = reply.choices[0].message.tool_calls
    assert call.type == "custom"
    assert (call.custom.name, call.custom.input) == ("shell", "ls -la")
    prompt = FakeEngine().tokenizer.decode(server.engine.requests[-1].prompt_ids)
    assert '"name": "shell"' in prompt and '"input": {"type": "string"}' in prompt


def test_malformed_call_is_text(client):
    reply = chat(client, "broken", tools=[WEATHER_TOOL])
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == BROKEN_REPLY.split("\n\n", 1)[1]


def test_tool_history_renders_in_order(server, client):
    messages = [
        {"role": "user", "content": "weather"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"z": 1, "a": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": "{}"},
        },
        {
            "role": "function",
            "name": "get_weather",
            "content": [{"type": "text", "text": "wa"}, {"type": "text", "text": "rm"}],
        },
    ]
    chat(client, None, messages=messages, tools=[WEATHER_TOOL])
    prompt = FakeEngine().tokenizer.decode(server.engine.requests[-1].prompt_ids)
    assert "<parameter=z>\n1\n</parameter>\n<parameter=a>\nx\n</parameter>" in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert "<tool_response>\nwarm\n</tool_response>" in prompt


def test_tolerant_tool_calls_recover_a_truncated_call():
    engine = _engine()
    running = start_server(engine, chat_template=QWEN, tolerant_tool_calls=True)
    try:
        client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
        reply = chat(client, "broken", tools=[WEATHER_TOOL])
        (call,) = reply.choices[0].message.tool_calls
        assert json.loads(call.function.arguments) == {"city": "Paris"}
    finally:
        running.stop()


# ---- observations -----------------------------------------------------------------------


def sse_events(server, body):
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_return_progress_reports_every_committed_prefill_chunk():
    engine = FakeEngine(EngineConfig(max_concurrency=1, prefill_chunk=8))
    running = start_server(engine)
    try:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "a prompt of several prefill chunks"}],
            "stream": True,
            "return_progress": True,
        }
        events = sse_events(running, body)
        total = len(engine.requests[-1].prompt_ids)
        progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
        assert [p["processed"] for p in progress] == [0, *range(8, total, 8), total]
        assert all(p["total"] == total and p["cache"] == 0 for p in progress)
        times = [p["time_ms"] for p in progress]
        assert times == sorted(times)
        assert all(e["choices"] == [] for e in events if "prompt_progress" in e)
        without = sse_events(running, {**body, "return_progress": False})
        assert not any("prompt_progress" in e for e in without)
        assert not engine.requests[-1].report_progress
    finally:
        running.stop()


def test_return_progress_and_timings_per_token(server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "reason"}],
        "stream": True,
        "return_progress": True,
        "timings_per_token": True,
    }
    events = sse_events(server, body)
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    total = len(server.engine.requests[-1].prompt_ids)
    assert progress[0]["processed"] == progress[0]["cache"] == 0
    assert progress[-1]["processed"] == progress[-1]["total"] == total
    first_delta = next(
        i
        for i, e in enumerate(events)
        if e["choices"] and e["choices"][0]["delta"].get("reasoning_content")
    )
    assert (
        events.index(
            next(e for e in events if e.get("prompt_progress", {}).get("processed") == total)
        )
        < first_delta
    )
    visible = [
        e
        for e in events
        if e["choices"]
        and (
            e["choices"][0]["delta"].get("content")
            or e["choices"][0]["delta"].get("reasoning_content")
        )
    ]
    counts = [e["timings"]["predicted_n"] for e in visible]
    assert counts == sorted(counts) and counts[-1] <= tokens(REASONED)
    assert "timings" in events[-1]


def test_return_token_ids(server, client):
    reply = chat(client, "plain", extra_body={"return_token_ids": True})
    assert reply.model_extra["prompt_token_ids"] == server.engine.requests[-1].prompt_ids
    ids = reply.choices[0].model_extra["token_ids"]
    assert FakeEngine().tokenizer.decode(ids[:-1]) == PLAIN_REPLY and ids[-1] == 2


def test_vllm_extensions_reach_the_engine(server, client):
    chat(
        client,
        "plain",
        extra_body={"ignore_eos": True, "min_tokens": 3, "stop_token_ids": [7, 9]},
        max_tokens=5,
    )
    request = server.engine.requests[-1]
    assert (request.ignore_eos, request.min_tokens, request.stop_token_ids) == (True, 3, [7, 9])
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, "plain", extra_body={"stop_token_ids": [10**6]})
    assert info.value.param == "stop_token_ids[0]"


# ---- sampling defaults per architecture and thinking mode ---------------------------------


def test_qwen_sampling_presets_by_thinking_mode():
    running = start_server(
        _engine("qwen3_5_moe"), chat_template=QWEN, process_sampling={"top_p": 0.5}
    )
    try:
        client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
        chat(client, "plain")
        s = running.engine.requests[-1].sampling
        assert (s.temperature, s.top_p, s.top_k, s.min_p, s.presence_penalty) == (
            1.0,
            0.5,
            20,
            0.0,
            1.5,
        )
        chat(client, "plain", extra_body={"enable_thinking": False}, presence_penalty=0.25)
        s = running.engine.requests[-1].sampling
        assert (s.temperature, s.top_p, s.top_k, s.presence_penalty) == (0.7, 0.5, 20, 0.25)
    finally:
        running.stop()


def test_stop_strings_apply_to_reasoning_and_answer(client):
    in_reasoning = chat(client, "reason", stop=["me think"])
    message = in_reasoning.choices[0].message
    assert message.model_extra["reasoning_content"] == "Let "  # only line breaks are trimmed
    assert not message.content
    assert in_reasoning.choices[0].finish_reason == "stop"
    in_answer = chat(client, "reason", stop=["is 4"])
    assert in_answer.choices[0].message.content == "The answer "
    assert in_answer.choices[0].message.model_extra["reasoning_content"] == "Let me think."
