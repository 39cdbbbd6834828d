"""Randomly damaged requests must never produce a 500: every answer is 200 or a 4xx envelope."""

from __future__ import annotations

import copy
import json
import random

import httpx
import pytest

from fake_engine import FakeEngine
from server_harness import start_server

VALID = {
    "model": "fake-chat",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello", "reasoning_content": "r"},
        {"role": "user", "content": "again"},
    ],
    "max_tokens": 8,
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 4,
    "min_p": 0.1,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "seed": 5,
    "stop": ["zz"],
    "stream": False,
    "chat_template_kwargs": {"enable_thinking": False},
}
ODD_VALUES = [None, True, -1, 0, 2**70, -(2**70), 1e308, -0.5, 3.7, "", "x", "<|im_end|>", [],
              [1, "a"], {}, {"type": "text"}, {"role": "user"}, "\ud7ff\ue000"]  # fmt: skip


def mutate(rng: random.Random, value):
    """Replace, drop or duplicate one randomly chosen node of a JSON value."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        choice = rng.random()
        if choice < 0.2:
            del value[key]
        elif choice < 0.5:
            value[key] = rng.choice(ODD_VALUES)
        else:
            value[key] = mutate(rng, value[key])
        return value
    if isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        if rng.random() < 0.3:
            value.append(copy.deepcopy(value[i]))
        else:
            value[i] = mutate(rng, value[i])
        return value
    return copy.deepcopy(rng.choice(ODD_VALUES))  # a shared one could end up inside itself


@pytest.fixture(scope="module")
def server():
    running = start_server(FakeEngine(max_context=512))
    yield running
    running.stop()


def test_random_damage_never_yields_a_server_error(server):
    rng = random.Random(20261129)
    url = server.base_url + "/v1/chat/completions"
    with httpx.Client(timeout=10) as client:
        for _ in range(300):
            body = mutate(rng, copy.deepcopy(VALID))
            for _ in range(rng.randint(0, 2)):
                body = mutate(rng, body)
            response = client.post(url, content=json.dumps(body))
            assert response.status_code < 500, (body, response.text)
            if response.status_code != 200:
                error = response.json()["error"]
                assert error["message"] and error["code"], (body, error)
