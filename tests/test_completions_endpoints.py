"""POST /v1/completions (openai SDK), /tokenize, /detokenize and GET /version."""

from __future__ import annotations

import httpx
import openai
import pytest

from fake_engine import CHATML_TEMPLATE, FakeEngine
from ninfer.engine_types import EngineConfig
from ninfer.prompt import ChatTemplate
from server_harness import start_server

MODEL = "fake-chat"
CONTEXT = 256


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(EngineConfig(max_concurrency=2), max_context=CONTEXT)
    running = start_server(engine)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def chatml(text: str) -> list[int]:
    rendered = ChatTemplate(CHATML_TEMPLATE, bos_token="", eos_token="").render(
        [{"role": "user", "content": text}]
    )
    return FakeEngine().tokenizer.encode(rendered)


def test_string_prompt_aggregate(server, client):
    ids = chatml("abc")
    prompt = FakeEngine().tokenizer.decode(ids)
    reply = client.completions.create(model=MODEL, prompt=prompt, temperature=0)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].text == "You said: abc."
    assert reply.choices[0].finish_reason == "stop"
    assert server.engine.requests[-1].prompt_ids == ids  # control tokens allowed, no template
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.usage.completion_tokens == len("You said: abc.") + 1
    assert "timings" in reply.model_extra


def test_token_id_prompt_and_return_token_ids(server, client):
    ids = chatml("xyz")
    reply = client.completions.create(
        model=MODEL, prompt=ids, temperature=0, extra_body={"return_token_ids": True}
    )
    assert reply.choices[0].text == "You said: xyz."
    assert reply.choices[0].model_extra["prompt_token_ids"] == ids
    out = reply.choices[0].model_extra["token_ids"]
    assert FakeEngine().tokenizer.decode(out[:-1]) == "You said: xyz." and out[-1] == 2
    one = client.completions.create(model=MODEL, prompt=[ids], temperature=0)
    assert one.choices[0].text == reply.choices[0].text


def test_stream_with_usage(client):
    prompt = FakeEngine().tokenizer.decode(chatml("s"))
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text.startswith("You said: s.")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_non_positive_max_tokens_means_up_to_the_context(server, client):
    prompt = FakeEngine().tokenizer.decode(chatml("long: go"))
    for value in (0, -1):
        reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=value)
        used = len(server.engine.requests[-1].prompt_ids)
        assert server.engine.requests[-1].max_tokens == CONTEXT - used
        assert reply.usage.completion_tokens == CONTEXT - used
        assert reply.choices[0].finish_reason == "length"


def test_vllm_extensions(server, client):
    client.completions.create(
        model=MODEL,
        prompt="p",
        max_tokens=4,
        extra_body={"ignore_eos": True, "min_tokens": 2, "stop_token_ids": [5]},
    )
    r = server.engine.requests[-1]
    assert (r.ignore_eos, r.min_tokens, r.stop_token_ids, r.max_tokens) == (True, 2, [5], 4)


@pytest.mark.parametrize(
    ("extra", "code", "param"),
    [
        ({"prompt": ["a", "b"]}, "unsupported_parameter", "prompt"),
        ({"prompt": [1, 10**6]}, "invalid_value", "prompt[1]"),
        ({"prompt": []}, "invalid_value", "prompt"),
        ({"n": 2}, "unsupported_parameter", "n"),
        ({"best_of": 3}, "unsupported_parameter", "best_of"),
        ({"echo": True}, "unsupported_parameter", "echo"),
        ({"logprobs": 2}, "unsupported_parameter", "logprobs"),
        ({"suffix": "x"}, "unsupported_parameter", "suffix"),
        ({"mm_processor_kwargs": {"fps": 1}}, "unsupported_parameter", "mm_processor_kwargs.fps"),
        ({"model": "other"}, "model_not_found", "model"),
        ({"prompt": "x" * (CONTEXT + 5)}, "context_length_exceeded", "prompt"),
    ],
)
def test_completion_rejections(server, extra, code, param):
    body = {"model": MODEL, "prompt": "hi", **extra}
    reply = httpx.post(server.base_url + "/v1/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


def test_tokenize_text_and_chat_forms(server):
    url = server.base_url + "/tokenize"
    text = httpx.post(url, json={"prompt": "a<|im_end|>", "return_token_strs": True}).json()
    assert text["tokens"] == FakeEngine().tokenizer.encode("a<|im_end|>")
    assert text["count"] == 2 and text["max_model_len"] == CONTEXT
    assert text["token_strs"] == ["a", "<|im_end|>"]
    messages = [{"role": "user", "content": "hey"}]
    chat = httpx.post(url, json={"model": MODEL, "messages": messages}).json()
    assert chat["tokens"] == chatml("hey")
    bare = httpx.post(url, json={"messages": messages, "add_generation_prompt": False}).json()
    assert bare["tokens"] == chat["tokens"][: len(bare["tokens"])]
    assert len(bare["tokens"]) < len(chat["tokens"])
    bad = httpx.post(url, json={"messages": messages, "chat_template_kwargs": {"messages": []}})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "chat_template_kwargs.messages"
    both = httpx.post(url, json={"messages": messages, "prompt": "x"})
    assert both.status_code == 400


def test_detokenize_and_version(server):
    ids = chatml("round trip")
    reply = httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json()
    assert reply["prompt"] == FakeEngine().tokenizer.decode(ids)
    bad = httpx.post(server.base_url + "/detokenize", json={"tokens": [0, 999999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[1]"
    import ninfer

    assert httpx.get(server.base_url + "/version").json() == {"version": ninfer.__version__}


def test_empty_or_null_mm_processor_kwargs_are_accepted(server):
    for kwargs in ({}, {"fps": None}):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "mm_processor_kwargs": kwargs}
        reply = httpx.post(server.base_url + "/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
