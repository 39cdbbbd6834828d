"""The real CPU engine behind /metrics and the failure contract (a tiny random-weight Llama).

The engine's counters are the core's own atomics; failures are injected through the core's
test hook (`inject_step_failures`), so recovery and engine death run the real code paths.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from metrics_scrape import leave_stream_midway, scrape, scrape_settled, wait_for
from ninfer.engine_types import EngineConfig
from server_harness import start_server

pytest.importorskip("ninfer._core")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return make_random_artifact(
        LLAMA, tmp_path_factory.mktemp("art") / "tiny.ninfer", seed=11, name=MODEL
    )


def _start(artifact):
    config = EngineConfig(max_concurrency=2, max_context=4096, prefill_chunk=32,
                          max_pending_requests=4)  # fmt: skip
    return start_server(AsyncEngine.open(artifact, config), default_max_tokens=16)


@pytest.fixture(scope="module")
def server(artifact):
    running = _start(artifact)
    yield running
    running.stop()


def chat(server, text: str, **body) -> httpx.Response:
    return httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": text}], **body},
        timeout=30,
    )


def test_engine_counters_match_the_usage_of_known_requests(server):
    before = scrape(server.base_url)
    usages = [
        chat(server, "one two three", temperature=0, max_tokens=6).json()["usage"],
        chat(server, "four", temperature=0, max_tokens=9).json()["usage"],
    ]
    after = scrape_settled(server.base_url, before, 2)

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    assert grew("ninfer_prompt_tokens_total") == prompt
    assert grew("ninfer_prefill_tokens_total") == prompt
    assert grew("ninfer_generation_tokens_total") == completion
    assert grew("ninfer_decode_tokens_total") == completion - len(usages)
    assert grew("ninfer_requests_total", outcome="completed") == 2
    assert grew("ninfer_time_to_first_token_seconds_count") == 2
    assert grew("ninfer_request_duration_seconds_count") == 2
    assert after.value("ninfer_max_concurrency") == 2
    assert after.value("ninfer_max_context_tokens") == 4096
    assert after.value("ninfer_device_kv_capacity_pages") > 0
    assert after.value("ninfer_device_kv_used_pages") == 0  # both requests released theirs
    assert after.value("ninfer_requests_running") == 0
    assert after.value("ninfer_engine_ready") == 1


PHASES = ("engine_boundary", "program_submit", "program_post", "engine_commit_output",
          "engine_maintenance")  # fmt: skip


def test_worker_time_grows_with_work_and_stays_within_the_wall_clock(server):
    """Each busy second of the worker counts once, in one host phase or in device wait (on
    the CPU backend the forward pass itself), so the sum cannot exceed the elapsed time."""
    before = scrape(server.base_url)
    started = time.monotonic()
    assert chat(server, "count the worker's time", temperature=0, max_tokens=12).status_code == 200
    after = scrape_settled(server.base_url, before, 1)
    elapsed = time.monotonic() - started

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    device_wait = grew("ninfer_device_wait_seconds_total")
    host = {phase: grew("ninfer_host_work_seconds_total", phase=phase) for phase in PHASES}
    assert device_wait > 0  # prefill and decode forwards ran
    # Every unit plans a step, prepares and commits it; the request finished, so it retired.
    for phase in PHASES:
        assert host[phase] > 0, (phase, host)
    assert device_wait + sum(host.values()) <= elapsed
    # An idle scrape moves nothing: the worker's sleep is not work.
    idle = scrape(server.base_url)
    time.sleep(0.2)
    again = scrape(server.base_url)
    assert again.value("ninfer_device_wait_seconds_total") == idle.value(
        "ninfer_device_wait_seconds_total"
    )
    assert sum(again.value("ninfer_host_work_seconds_total", phase=p) for p in PHASES) == sum(
        idle.value("ninfer_host_work_seconds_total", phase=p) for p in PHASES
    )


def test_a_client_leaving_mid_stream_counts_as_cancelled(server):
    before = scrape(server.base_url)
    body = {"model": MODEL, "stream": True, "max_tokens": 4000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
    leave_stream_midway(server.port, body, {})
    cancelled = before.outcome("cancelled") + 1
    wait_for(lambda: scrape(server.base_url).outcome("cancelled") == cancelled)
    assert scrape(server.base_url).value("ninfer_requests_running") == 0


def test_failed_units_recover_and_are_logged(server, caplog):
    core = server.engine._core
    before = scrape(server.base_url)
    with caplog.at_level("WARNING"):
        core.inject_step_failures(1)
        assert chat(server, "x", max_tokens=4).status_code == 500
        core.inject_step_failures(1, out_of_memory=True)
        assert chat(server, "x", max_tokens=4).status_code == 500
        assert chat(server, "x", max_tokens=4).status_code == 200  # the engine carried on
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("engine | worker recovering from a failed request") for m in messages)
    assert any(
        m.startswith("engine | worker out of memory:") and m.endswith("- recovering")
        for m in messages
    )
    after = scrape(server.base_url)
    assert after.outcome("failed") == before.outcome("failed") + 2
    assert after.value("ninfer_engine_ready") == 1
    assert core.stats()["recoveries_out_of_memory"] >= 1


def test_eight_failures_in_a_row_end_the_engine(artifact):
    running = _start(artifact)
    try:
        running.engine._core.inject_step_failures(8)
        for _ in range(7):
            assert chat(running, "x", max_tokens=4).status_code == 500
            assert httpx.get(running.base_url + "/health").status_code == 200  # still recovering
        assert chat(running, "x", max_tokens=4).status_code == 500
        wait_for(lambda: httpx.get(running.base_url + "/health").status_code == 503)
        assert httpx.get(running.base_url + "/health").json() == {"status": "unavailable"}
        metrics = scrape(running.base_url)  # still readable after the engine failed
        assert metrics.value("ninfer_engine_ready") == 0
        assert metrics.outcome("failed") == 8
        assert chat(running, "x", max_tokens=4).status_code == 503
    finally:
        running.stop()


def test_pressure_pauses_are_counted(artifact):
    """Four long requests over a 10-page KV pool: younger ones are paused and replayed, and
    the pause families say so (prefill excludes the replayed tokens)."""
    config = EngineConfig(max_concurrency=4, max_context=512, prefill_chunk=32,
                          max_pending_requests=4, kv_capacity=640)  # fmt: skip
    running = start_server(AsyncEngine.open(artifact, config))
    try:
        body = {"max_tokens": 150, "ignore_eos": True, "temperature": 0}
        for _ in range(5):  # the requests must overlap; a busy machine may serialise them
            before = scrape(running.base_url)
            with ThreadPoolExecutor(4) as pool:
                replies = list(
                    pool.map(lambda i: chat(running, f"{i} " + "word " * (60 + 20 * i), **body),
                             range(4))
                )  # fmt: skip
            assert all(reply.status_code == 200 for reply in replies)
            after = scrape_settled(running.base_url, before, 4)
            if after.value("ninfer_preemptions_total") > before.value("ninfer_preemptions_total"):
                break
        else:
            raise AssertionError("no request was ever paused")

        def grew(name: str) -> float:
            return after.value(name) - before.value(name)

        assert grew("ninfer_replay_restores_total") == grew("ninfer_preemptions_total")
        assert grew("ninfer_replayed_tokens_total") > 0, running.engine.stats()
        assert after.value("ninfer_snapshot_restores_total") == 0
        prompt = sum(reply.json()["usage"]["prompt_tokens"] for reply in replies)
        cached = grew("ninfer_prompt_tokens_cached_total")
        assert grew("ninfer_prefill_tokens_total") == prompt - cached
        assert after.value("ninfer_requests_paused") == 0
        assert after.value("ninfer_requests_replaying") == 0
    finally:
        running.stop()
