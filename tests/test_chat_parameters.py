"""Every accepted and rejected Chat Completions field, through the openai SDK (live server).

Rejections must be HTTP 400 with a code and a `param` naming the field; neutral values and
unknown top-level fields must be accepted without changing what the engine is asked to do.
"""

from __future__ import annotations

import openai
import pytest

from fake_engine import FakeEngine
from ninfer.engine_types import EngineConfig
from ninfer.protocols.sampling import seed_to_engine
from ninfer.server.config import AppConfig
from server_harness import start_server

MODEL = "fake-chat"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    running = start_server(FakeEngine(EngineConfig(max_concurrency=2, max_pending_requests=8)))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def create(client, messages=USER, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=messages, **kwargs)


def image(detail=None):
    url = {"url": "data:image/png;base64,AAAA"}
    if detail:
        url["detail"] = detail
    return [{"role": "user", "content": [{"type": "image_url", "image_url": url}]}]


DETAIL = "messages[0].content[0].image_url.detail"
REJECTED = [
    ({"logit_bias": {"5": 2}}, "unsupported_parameter", "logit_bias"),
    ({"logprobs": True}, "unsupported_parameter", "logprobs"),
    ({"top_logprobs": 3}, "unsupported_parameter", "top_logprobs"),
    ({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]},
     "unsupported_parameter", "modalities"),
    ({"audio": "alloy"}, "invalid_type", "audio"),
    ({"mm_processor_kwargs": {"fps": 2}}, "unsupported_parameter", "mm_processor_kwargs.fps"),
    ({"mm_processor_kwargs": {"a": None, "b": {}}}, "unsupported_parameter",
     "mm_processor_kwargs.b"),
    ({"mm_processor_kwargs": []}, "invalid_type", "mm_processor_kwargs"),
    ({"modalities": ["text", "audio"]}, "unsupported_parameter", "modalities"),
    ({"web_search_options": {}}, "unsupported_parameter", "web_search_options"),
    ({"verbosity": "low"}, "unsupported_parameter", "verbosity"),
    ({"verbosity": "high"}, "unsupported_parameter", "verbosity"),
    ({"store": True}, "unsupported_parameter", "store"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "unsupported_parameter", "functions"),
    ({"function_call": {"name": "f"}}, "unsupported_parameter", "function_call"),
    ({"n": 2}, "unsupported_parameter", "n"),
    ({"repetition_penalty": 1.1}, "unsupported_parameter", "repetition_penalty"),
    ({"response_format": {"type": "json_object"}}, "unsupported_parameter", "response_format"),
    ({"top_k": 21}, "invalid_value", "top_k"),
    ({"top_k": -1}, "invalid_value", "top_k"),
    ({"min_p": 1.5}, "invalid_value", "min_p"),
    ({"seed": -(1 << 63) - 1}, "invalid_value", "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_value", "stop"),
    ({"max_completion_tokens": -1}, "invalid_value", "max_completion_tokens"),
    ({"messages": image("high")}, "unsupported_parameter", DETAIL),
    ({"messages": image("low")}, "unsupported_parameter", DETAIL),
    ({"messages": image()}, "vision_disabled", "messages[0].content[0].type"),
    (
        {"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
        "unsupported_parameter",
        "messages[0].content[0].type",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
        "unsupported_parameter",
        "messages[0].content[0].type",
    ),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "unsupported_parameter",
     "messages[0].name"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c", "name": 5}]},
     "invalid_type", "messages[0].name"),
    ({"tools": [{"type": "web_search"}]}, "unsupported_parameter", "tools[0].type"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "code", "param"), REJECTED)
def test_rejections_name_field_and_guarantee(client, extra, code, param):
    body = {"messages": USER, **extra}
    messages = body.pop("messages")
    with pytest.raises(openai.BadRequestError) as info:
        create(client, messages=messages, extra_body=body)
    assert info.value.status_code == 400
    assert (info.value.code, info.value.param) == (code, param)
    assert info.value.body["message"]


NEUTRAL = [
    {"logit_bias": {"5": 0, "7": 0.0}},
    {"logprobs": False},
    {"top_logprobs": 0},
    {"verbosity": "medium"},
    {"metadata": {"k": "v"}},
    {"user": "u-1"},
    {"safety_identifier": "s"},
    {"service_tier": "auto"},
    {"prompt_cache_key": "conversation-7"},
    {"prompt_cache_retention": "24h"},
    {"store": False},
    {"n": 1},
    {"modalities": ["text"]},
    {"modalities": ["text"], "audio": {"voice": "alloy", "format": "wav"}},
    {"audio": {"voice": "alloy", "format": "mp3"}},
    {"audio": None},
    {"mm_processor_kwargs": {}},
    {"mm_processor_kwargs": {"fps": None, "max_pixels": None}},
    {"response_format": {"type": "text"}},
    {"functions": []},
    {"function_call": "auto"},
    {"parallel_tool_calls": True},
    {"tool_choice": "none"},
    {"prediction": {"type": "content", "content": "x"}},
    {"repetition_penalty": 1},
    {"some_future_field": {"x": 1}},
]


@pytest.mark.parametrize("extra", NEUTRAL)
def test_neutral_values_change_nothing(server, client, extra):
    baseline = create(client, temperature=0)
    request = server.engine.requests[-1]
    reply = create(client, temperature=0, extra_body=extra)
    assert reply.choices[0].message.content == baseline.choices[0].message.content
    changed = server.engine.requests[-1]
    assert (changed.prompt_ids, changed.sampling, changed.max_tokens, changed.stop_strings) == (
        request.prompt_ids,
        request.sampling,
        request.max_tokens,
        request.stop_strings,
    )


def test_accepted_sampling_surface_reaches_the_engine(server, client):
    create(
        client,
        temperature=0.5,
        top_p=0.9,
        presence_penalty=-0.5,
        frequency_penalty=1.0,
        seed=-5,
        stop=["x", "y", "z", "w"],
        max_completion_tokens=7,
        extra_body={"top_k": 20, "min_p": 0.1},
    )
    request = server.engine.requests[-1]
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.5, 0.9, 20, 0.1)
    assert (s.presence_penalty, s.frequency_penalty, s.seed) == (-0.5, 1.0, seed_to_engine(-5))
    assert request.stop_strings == ["x", "y", "z", "w"]
    assert request.max_tokens == 7
    create(client, max_tokens=3, extra_body={"top_k": 0})
    assert server.engine.requests[-1].max_tokens == 3
    assert server.engine.requests[-1].sampling.top_k == 0


def test_max_tokens_zero_is_prompt_processing_only(server, client):
    reply = create(client, max_completion_tokens=0)
    assert reply.usage.completion_tokens == 0
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(server.engine.requests[-1].prompt_ids)


def test_usage_chunk_choice_flag():
    running = start_server(FakeEngine(), AppConfig(usage_chunk_choice=True))
    try:
        client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
        chunks = list(create(client, stream=True, stream_options={"include_usage": True}))
        last = chunks[-1]
        assert last.usage is not None
        assert len(last.choices) == 1 and last.choices[0].delta.content is None
    finally:
        running.stop()
