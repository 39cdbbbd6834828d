"""Sampling precedence: artifact defaults < process flags < request fields < --greedy."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from fake_engine import FakeEngine
from ninfer.protocols.sampling import SamplingPolicy, artifact_sampling_defaults, seed_to_engine
from ninfer.server.config import AppConfig
from server_harness import start_server

USER = [{"role": "user", "content": "hi"}]


def test_layers_apply_in_order():
    policy = SamplingPolicy(
        artifact_defaults={"temperature": 0.6, "top_p": 0.9, "top_k": 40},
        process_overrides={"temperature": 0.3, "min_p": 0.05},
    )
    params = policy.resolve({"top_k": 7, "top_p": None}, seed=None)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.3, 0.9, 7, 0.05)
    assert params.seed is None
    assert policy.resolve({"temperature": 1.2}, seed=None).temperature == 1.2


def test_greedy_wins_over_everything():
    policy = SamplingPolicy(artifact_defaults={"temperature": 0.6}, greedy=True)
    assert policy.resolve({"temperature": 1.5}, seed=3).temperature == 0.0


def test_seed_precedence_and_mapping():
    policy = SamplingPolicy(process_seed=-1)
    assert policy.resolve({}, seed=None).seed == 2**64 - 1
    assert policy.resolve({}, seed=42).seed == 42
    assert seed_to_engine(-(2**63)) == 2**63
    assert len({seed_to_engine(s) for s in (-2, -1, 0, 1, 2)}) == 5


def test_empty_nucleus_is_greedy():
    assert SamplingPolicy().resolve({"top_p": 0.0, "temperature": 0.8}, None).temperature == 0.0


def test_artifact_generation_config_is_read():
    generation = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1,
                  "max_new_tokens": 100, "do_sample": True}  # fmt: skip
    assert artifact_sampling_defaults(generation) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    assert artifact_sampling_defaults({"do_sample": False, "temperature": 0.7}) == {
        "temperature": 0.0
    }
    assert artifact_sampling_defaults({"temperature": "hot", "top_k": True}) == {}


@pytest.fixture
def layered_server():
    engine = FakeEngine()
    engine.header["generation"] = {"temperature": 0.6, "top_p": 0.9, "top_k": 40}
    running = start_server(
        engine, process_sampling={"temperature": 0.3, "min_p": 0.05}, process_seed=99
    )
    yield running
    running.stop()


def test_precedence_through_the_server(layered_server):
    client = openai.OpenAI(base_url=layered_server.base_url + "/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model="fake-chat", messages=USER, extra_body={"top_k": 3})
    sampling = layered_server.engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (
        0.3, 0.9, 3, 0.05)  # fmt: skip
    assert sampling.seed == 99


def test_greedy_flag_through_the_server():
    running = start_server(FakeEngine(), greedy=True)
    try:
        client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="fake-chat", messages=USER, temperature=1.5)
        assert reply.choices[0].message.content == "You said: hi."
        assert running.engine.requests[-1].sampling.temperature == 0.0
    finally:
        running.stop()


def test_usage_chunk_choice_option():
    running = start_server(FakeEngine(), AppConfig(usage_chunk_choice=True))
    try:
        body = {"model": "fake-chat", "messages": USER, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", running.base_url + "/v1/chat/completions", json=body) as r:
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
        usage_chunk = json.loads(data[-1])
        assert usage_chunk["usage"]["completion_tokens"] > 0
        assert usage_chunk["choices"] == [
            {"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}
        ]
    finally:
        running.stop()


def test_thinking_flags_reach_the_template():
    engine = FakeEngine()
    engine.chat_template = lambda: (
        "{{ 'think=' ~ (enable_thinking if enable_thinking is defined else 'unset') }}"
        "{{ ' keep=' ~ (preserve_thinking if preserve_thinking is defined else 'unset') }}"
        "<|im_start|>user\n{{ messages[-1]['content'] }}<|im_end|>"
    )
    running = start_server(engine, no_thinking=True, preserve_thinking=True)
    try:
        url = running.base_url + "/v1/chat/completions"
        httpx.post(url, json={"model": "fake-chat", "messages": USER})
        prompt = engine.tokenizer.decode(engine.requests[-1].prompt_ids)
        assert prompt.startswith("think=False keep=True")
        httpx.post(url, json={"model": "fake-chat", "messages": USER, "enable_thinking": True})
        assert engine.tokenizer.decode(engine.requests[-1].prompt_ids).startswith("think=True")
        conflict = httpx.post(
            url,
            json={"model": "fake-chat", "messages": USER, "enable_thinking": True,
                  "chat_template_kwargs": {"enable_thinking": False}},
        )  # fmt: skip
        assert conflict.status_code == 400
        assert conflict.json()["error"]["code"] == "conflicting_template_option"
        reserved = httpx.post(
            url,
            json={"model": "fake-chat", "messages": USER,
                  "chat_template_kwargs": {"messages": []}},
        )  # fmt: skip
        assert reserved.json()["error"]["param"] == "chat_template_kwargs.messages"
    finally:
        running.stop()
