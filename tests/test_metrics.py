"""GET /metrics over the fake engine: families, counter deltas per outcome, histograms, auth."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from fake_engine import FakeEngine
from metrics_scrape import Scrape, leave_stream_midway, scrape, scrape_settled, wait_for
from ninfer.engine_types import EngineConfig
from ninfer.server.app import AppConfig
from ninfer.server.request_log import RequestLog
from ninfer.server.telemetry import Telemetry
from server_harness import start_server

KEY = "metrics-test-key"
MODEL = "fake-chat"
FAMILIES = (
    "ninfer_model_info",
    "ninfer_max_concurrency",
    "ninfer_max_context_tokens",
    "ninfer_requests_running",
    "ninfer_requests_waiting",
    "ninfer_requests_prefilling",
    "ninfer_requests_decode_ready",
    "ninfer_requests_paused",
    "ninfer_requests_replaying",
    "ninfer_requests_materializing",
    "ninfer_replayed_tokens",
    "ninfer_preemptions",
    "ninfer_snapshot_restores",
    "ninfer_replay_restores",
    "ninfer_prompt_tokens",
    "ninfer_prompt_tokens_cached",
    "ninfer_prefill_tokens",
    "ninfer_generation_tokens",
    "ninfer_decode_tokens",
    "ninfer_requests",
    "ninfer_response_failures",
    "ninfer_device_kv_used_pages",
    "ninfer_device_kv_capacity_pages",
    "ninfer_time_to_first_token_seconds",
    "ninfer_request_duration_seconds",
    "ninfer_request_queue_seconds",
    "ninfer_engine_ready",
    "ninfer_constraint_requests",
    "ninfer_constraint_cache",
    "ninfer_constraint_mask_positions",
    "ninfer_constraint_mask_upload_bytes",
    "ninfer_constraint_prepare_seconds",
    "ninfer_constraint_mask_seconds",
    "ninfer_constraint_matcher_seconds",
    "ninfer_host_context_used_bytes",
    "ninfer_host_context_reserved_bytes",
    "ninfer_host_context_capacity_bytes",
    "ninfer_host_context_peak_bytes",
    "ninfer_context_transfer_bytes",
    "ninfer_host_work_seconds",
    "ninfer_device_wait_seconds",
    "ninfer_constraint_draft_wait_seconds",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = FakeEngine(EngineConfig(max_concurrency=2, max_pending_requests=1))
    log_path = tmp_path_factory.mktemp("log") / "requests.jsonl"
    telemetry = Telemetry(request_log=RequestLog(log_path))
    running = start_server(engine, AppConfig(api_key=KEY), telemetry=telemetry)
    running.log_path = log_path
    yield running
    running.stop()


def chat(server, text: str, **body) -> httpx.Response:
    return httpx.post(
        server.base_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": text}], **body},
        timeout=10,
    )


def now(server) -> Scrape:
    return scrape(server.base_url, KEY)


def test_families_identity_and_limits(server):
    metrics = now(server)
    for name in FAMILIES:
        assert name in metrics.families, name
    info = metrics.families["ninfer_model_info"].samples[0]
    assert info.labels["model"] == MODEL and info.labels["architecture"] == "llama"
    assert info.value == 1
    assert metrics.value("ninfer_max_concurrency") == 2
    assert metrics.value("ninfer_max_context_tokens") == 4096
    assert metrics.value("ninfer_engine_ready") == 1
    for family in metrics.families.values():  # bounded labels: never a request id or text
        for sample in family.samples:
            assert set(sample.labels) <= {"model", "architecture", "weight_format", "backend",
                                          "outcome", "result", "le", "resource",
                                          "direction", "phase"}  # fmt: skip
    assert metrics.families["ninfer_host_work_seconds"].type == "counter"
    assert metrics.families["ninfer_device_wait_seconds"].type == "counter"
    phases = {s.labels["phase"] for s in metrics.families["ninfer_host_work_seconds"].samples}
    assert phases == {"engine_boundary", "program_submit", "program_post",
                      "engine_commit_output", "engine_maintenance"}  # fmt: skip


def test_metrics_require_the_api_key(server):
    assert httpx.get(server.base_url + "/metrics", timeout=5).status_code == 401
    wrong = httpx.get(server.base_url + "/metrics", headers={"x-api-key": "nope"}, timeout=5)
    assert wrong.status_code == 401
    assert httpx.get(server.base_url + "/metrics", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200  # public


def test_completed_requests_move_token_counters_and_histograms(server):
    before = now(server)
    first = chat(server, "hi", temperature=0).json()
    second = chat(server, "hello there", temperature=0, max_tokens=4).json()
    after = scrape_settled(server.base_url, before, 2, KEY)
    usages = [first["usage"], second["usage"]]
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert grew("ninfer_prompt_tokens_total") == prompt
    assert grew("ninfer_prefill_tokens_total") == prompt
    assert grew("ninfer_prompt_tokens_cached_total") == 0
    assert grew("ninfer_generation_tokens_total") == completion
    assert grew("ninfer_decode_tokens_total") == completion - 2  # each request's first excluded
    assert grew("ninfer_requests_total", outcome="completed") == 2
    for histogram in ("time_to_first_token", "request_duration", "request_queue"):
        assert grew(f"ninfer_{histogram}_seconds_count") == 2
        assert grew(f"ninfer_{histogram}_seconds_bucket", le="+Inf") == 2
    assert after.value("ninfer_request_duration_seconds_sum") > before.value(
        "ninfer_request_duration_seconds_sum"
    )


def test_failed_and_cancelled_outcomes(server):
    before = now(server)
    failed = chat(server, "fail: now", temperature=0)
    assert failed.status_code == 500
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "long: x"}]}
    leave_stream_midway(server.port, body, {"x-api-key": KEY})
    wait_for(lambda: now(server).outcome("cancelled") == before.outcome("cancelled") + 1)
    after = scrape_settled(server.base_url, before, 1, KEY)
    assert after.outcome("failed") == before.outcome("failed") + 1
    assert after.outcome("completed") == before.outcome("completed")
    # Exceptional failures are counted, not timed; a cancellation is a settled outcome.
    assert (
        after.value("ninfer_request_duration_seconds_count")
        == before.value("ninfer_request_duration_seconds_count") + 1
    )
    assert after.value("ninfer_requests_running") == 0


def test_rejections_at_submit_are_counted_but_validation_errors_are_not(server):
    before = now(server)
    assert chat(server, 5).status_code == 400  # protocol validation: not a generation attempt

    async def flood() -> list[int]:
        async with httpx.AsyncClient(
            base_url=server.base_url, headers={"x-api-key": KEY}, timeout=10
        ) as client:
            body = {"model": MODEL, "max_tokens": 30, "messages": [
                {"role": "user", "content": "long: x"}]}  # fmt: skip
            replies = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body) for _ in range(5))
            )
            return [reply.status_code for reply in replies]

    statuses = asyncio.run(flood())
    assert statuses.count(429) >= 1  # 2 lanes + 1 pending slot
    after = now(server)
    assert after.outcome("rejected") - before.outcome("rejected") == statuses.count(429)
    assert after.outcome("completed") - before.outcome("completed") == statuses.count(200)


def test_scraping_does_not_reset_counters(server):
    chat(server, "hi", temperature=0)
    first = now(server)
    second = now(server)
    for key, value in first.samples.items():
        if key[0].endswith("_total") or key[0].endswith("_count"):
            assert second.samples[key] >= value, key


def test_request_log_has_one_terminal_record_per_started_request(server):
    chat(server, "hi", temperature=0)

    def read() -> list[dict]:
        return [json.loads(line) for line in open(server.log_path, encoding="utf-8")]

    def ids(records: list[dict], *events: str) -> list[int]:
        return sorted(r["request_id"] for r in records if r["event"] in events)

    # A terminal record is written once the answer has been sent, so it may trail it.
    wait_for(lambda: len(ids(read(), "request_done", "request_error")) == len(
        ids(read(), "request_start")))  # fmt: skip
    records = read()
    assert all(r["server_instance_id"] == records[0]["server_instance_id"] for r in records)
    assert ids(records, "request_done", "request_error") == ids(records, "request_start")
    done = [r for r in records if r["event"] == "request_done"]
    assert done and all(r["timings_seconds"]["total"] >= r["timings_seconds"]["ttft"] for r in done)
    assert all(
        len(r["result"]["generated_token_ids"]) == r["result"]["completion_tokens"] for r in done
    )
    kinds = {r["error"]["kind"] for r in records if r["event"] == "request_error"}
    assert {"failed", "cancelled"} <= kinds
    rejected = [r for r in records if r["event"] == "request_rejected"]
    assert {r["status"] for r in rejected} >= {400, 429}
    assert KEY not in server.log_path.read_text(encoding="utf-8")
