"""Data-parallel replicas behind vllm-router (docs/scale-out.md): two real ninfer-serve apps on
loopback, each with its own CPU engine over a tiny random Llama, and the router's binary in
front with its cache-aware policy.

Checked through the router: every protocol (Chat Completions, Responses, Messages, aggregate
and streamed, through the official SDKs) passes unmodified; the turns of one conversation land
on one replica (each replica's own /metrics request counter says which); and once a replica
stops, its conversations are served by the other.
"""

from __future__ import annotations

import os
import random
import signal
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm_router", reason="vllm-router is not installed (pip install vllm-router)")
pytest.importorskip("ninfer._core")

import anthropic  # noqa: E402
import openai  # noqa: E402

from metrics_scrape import scrape  # noqa: E402
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402
from ninfer.engine_types import EngineConfig  # noqa: E402
from ninfer.server.config import AppConfig  # noqa: E402
from server_harness import RunningServer, free_port, start_server  # noqa: E402

MODEL = "tiny"
LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=32,
    intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=512, max_position_embeddings=4096,
)  # fmt: skip


@dataclass
class Deployment:
    replicas: list[RunningServer]
    router_url: str
    router: subprocess.Popen

    def served(self) -> list[float | None]:
        """Each live replica's count of generations that reached its engine (None: stopped)."""
        counts = []
        for replica in self.replicas:
            try:
                s = scrape(replica.base_url)
            except httpx.TransportError:
                counts.append(None)
                continue
            counts.append(sum(s.outcome(o) for o in ("completed", "cancelled", "failed")))
        return counts


def _router_command(port: int, metrics_port: int, workers: list[str]) -> list[str]:
    launcher = Path(sys.executable).with_name("vllm-router")
    prefix = (
        [str(launcher)]
        if launcher.exists()
        else [sys.executable, "-m", "vllm_router.launch_router"]
    )
    return prefix + [
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--worker-urls", *workers,
        "--policy", "cache_aware",
        # notice a dead replica within a second or two instead of the default minute
        "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
        "--log-level", "warning",
    ]  # fmt: skip


def _wait_routing(url: str, router: subprocess.Popen, api_key: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if router.poll() is not None:
            raise RuntimeError(f"vllm-router exited with {router.returncode}")
        try:
            if httpx.get(url + "/v1/models", headers=headers, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("vllm-router did not start routing")


@contextmanager
def _deploy(directory: Path, api_key: str | None = None) -> Iterator[Deployment]:
    path = make_random_artifact(
        LLAMA, directory / "tiny.ninfer", seed=3, dtype="f32", name=MODEL, tokenizer="synthetic"
    )
    config = EngineConfig(device="cpu", max_concurrency=2, max_context=4096, threads=1)
    replicas = [
        start_server(
            AsyncEngine.open(path, config),
            AppConfig(api_key=api_key),
            model_id=MODEL,
            max_output_tokens=8,
        )
        for _ in range(2)
    ]
    port = free_port()
    command = _router_command(port, free_port(), [r.base_url for r in replicas])
    router = subprocess.Popen(
        command + (["--api-key", api_key] if api_key else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_routing(url, router, api_key)
        yield Deployment(replicas, url, router)
    finally:
        os.killpg(router.pid, signal.SIGTERM)
        try:
            router.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(router.pid, signal.SIGKILL)
        for replica in replicas:
            replica.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[Deployment]:
    with _deploy(tmp_path_factory.mktemp("dp")) as running:
        yield running


def _openai(d: Deployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.router_url + "/v1", api_key="unused", max_retries=0)


def test_models_and_health_pass_through(deployment):
    assert httpx.get(deployment.router_url + "/health", timeout=5).status_code == 200
    models = _openai(deployment).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert _openai(deployment).models.retrieve(MODEL).id == MODEL


def test_chat_completions_aggregate_and_streamed(deployment):
    client = _openai(deployment)
    messages = [{"role": "user", "content": "hello through the router"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=True)
    )
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1


def test_responses_aggregate_and_streamed(deployment):
    client = _openai(deployment)
    reply = client.responses.create(model=MODEL, input="hello", max_output_tokens=3, temperature=0)
    assert reply.status == "incomplete" and reply.usage.output_tokens == 3
    # greedy: a sampled end of turn within 3 tokens would end the stream "completed"
    stream = client.responses.create(
        model=MODEL, input="hello", max_output_tokens=3, stream=True, temperature=0
    )
    events = [e.type for e in stream]
    assert events[0] == "response.created" and events[-1] == "response.incomplete"


def test_messages_aggregate_and_streamed(deployment):
    client = anthropic.Anthropic(base_url=deployment.router_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "hello"}]
    greedy = {"temperature": 0}  # sampled, an end of turn within 3 tokens is possible
    reply = client.messages.create(model=MODEL, messages=messages, max_tokens=3, extra_body=greedy)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3
    with client.messages.stream(
        model=MODEL, messages=messages, max_tokens=3, extra_body=greedy
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"


def _conversation(seed: int) -> list[dict]:
    rnd = random.Random(seed)
    system = "".join(rnd.choice(string.ascii_lowercase + " ") for _ in range(600))
    return [{"role": "system", "content": f"conversation {seed}: {system}"}]


def _turn(d: Deployment, messages: list[dict], turn: int) -> tuple[int, int]:
    """Sends the conversation's next user turn; returns the replica that generated it and the
    prompt tokens it found in its prefix cache."""
    before = d.served()
    messages.append({"role": "user", "content": f"turn {turn}: tell me more"})
    reply = _openai(d).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or "."})
    after = d.served()
    grew = [
        i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a is not None and b > a
    ]
    assert len(grew) == 1, (before, after)
    return grew[0], reply.usage.prompt_tokens_details.cached_tokens


def test_turns_of_one_conversation_stay_on_one_replica(deployment):
    conversations = [_conversation(seed) for seed in range(4)]
    homes: list[set[int]] = [set() for _ in conversations]
    for turn in range(3):  # interleaved, as concurrent users would be
        for c, messages in enumerate(conversations):
            replica, cached = _turn(deployment, messages, turn)
            homes[c].add(replica)
            # the point of the affinity: a later turn finds its conversation in the cache
            assert turn == 0 or cached > 0, (c, turn)
    assert all(len(h) == 1 for h in homes), homes


def _wait_marked_unhealthy(d: Deployment, url: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        workers = httpx.get(d.router_url + "/workers", timeout=5).json()["workers"]
        if any(w["url"] == url and not w["is_healthy"] for w in workers):
            return
        time.sleep(0.1)
    raise AssertionError(f"vllm-router did not mark {url} unhealthy")


def test_a_stopped_replica_is_routed_around(deployment):
    conversation = _conversation(99)
    home, _ = _turn(deployment, conversation, 0)
    deployment.replicas[home].stop()
    survivor = 1 - home
    # Until its health check notices (here within about a second), the router may still pick
    # the dead replica and answer 500 (docs/scale-out.md); from then on nothing reaches it.
    _wait_marked_unhealthy(deployment, deployment.replicas[home].base_url)
    health = httpx.get(deployment.router_url + "/health", timeout=5)
    assert deployment.replicas[home].base_url in health.text
    for turn in range(1, 4):
        replica, cached = _turn(deployment, conversation, turn)
        assert replica == survivor
        assert turn < 3 or cached > 0  # the conversation's new home caches it from then on
    assert _turn(deployment, _conversation(100), 0)[0] == survivor


def test_replicas_with_an_api_key_behind_a_router_with_the_same_key(tmp_path):
    """The router checks the client's key (Bearer or x-api-key) and sends its own --api-key to
    the replicas, so every protocol works when both hold the same key."""
    with _deploy(tmp_path, api_key="sekret") as d:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(d.router_url + "/v1/chat/completions", json=body).status_code == 401
        client = openai.OpenAI(base_url=d.router_url + "/v1", api_key="sekret", max_retries=0)
        assert client.chat.completions.create(**body).usage.completion_tokens == 2
        reply = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
        assert reply.usage.output_tokens == 2
        anthropic_client = anthropic.Anthropic(  # sends x-api-key
            base_url=d.router_url, api_key="sekret", max_retries=0
        )
        assert anthropic_client.messages.create(**body).usage.output_tokens == 2
