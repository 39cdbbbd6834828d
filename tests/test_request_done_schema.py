"""The request log's request_done record, field by field (names, order, JSON types), over the
real CPU engine: a plain request, a repeated long prompt (prefix-cache reuse) and a
JSON-constrained one. docs/operations.md describes the same layout."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from metrics_scrape import wait_for
from ninfer.engine_types import EngineConfig
from ninfer.server.request_log import SCHEMA, SCHEMA_VERSION, RequestLog
from ninfer.server.telemetry import Telemetry
from server_harness import start_server

pytest.importorskip("ninfer._core")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny-llama"
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

NUMBER = (int, float)
OPTIONAL_STR = (str, type(None))
TOOL_CALL_PARSE = {
    "marker_seen": bool,
    "structured_call_count": int,
    "empty_non_string_omitted": int,
    "schema_mismatch_preserved": int,
    "duplicate_parameters_repaired": int,
    "fallback_reason": str,
    "tolerant_recovered": bool,
    "recovered_from_reasoning": bool,
}
CONSTRAINT = {
    "branch": str,
    "complete": bool,
    "terminated": bool,
    "cache": str,
    "mask_positions": int,
    "mask_upload_bytes": int,
    "timings_seconds": {"prepare": NUMBER, "mask": NUMBER, "matcher": NUMBER},
}
# Each value: a type (or tuple of types) of a leaf, a nested layout, or ("nullable", layout).
REQUEST_DONE: dict[str, Any] = {
    "schema": str,
    "schema_version": int,
    "event": str,
    "timestamp_unix_ms": int,
    "server_instance_id": str,
    "request_id": int,
    "http_request_id": str,
    "protocol": str,
    "result": {
        "finish_reason": str,
        "response_finish_reason": str,
        "stop_kind": OPTIONAL_STR,
        "prompt_tokens": int,
        "completion_tokens": int,
        "reasoning_tokens": int,
        "prefix_cache_hit_tokens": int,
        "prefill_tokens": int,
        "prefix_reuse_path": str,
        "tool_call_parse": ("nullable", TOOL_CALL_PARSE),
        "generated_token_ids": list,
    },
    "generation": {
        "scheduling": {
            "preemptions": int,
            "snapshot_restores": int,
            "replay_restores": int,
            "replayed_tokens": int,
            "paused_seconds": NUMBER,
            "transfer_bytes": int,
        },
        "admission": {
            "preferred_reused_tokens": int,
            "source_wait_seconds": NUMBER,
            "revoked_checkpoints": int,
            "fallback_reason": str,
        },
    },
    "constraint": ("nullable", CONSTRAINT),
    "timings_seconds": {
        "prepare": NUMBER,
        "ttft": NUMBER,
        "vision": type(None),
        "prefill": NUMBER,
        "decode": NUMBER,
        "total": NUMBER,
    },
    "speculative": type(None),  # no --spec backend
    "engine_timing": {"queue_wait_seconds": NUMBER, "decode_share_seconds": NUMBER},
}


def check_layout(value: Any, layout: Any, where: str = "request_done") -> None:
    if isinstance(layout, tuple) and layout and layout[0] == "nullable":
        if value is not None:
            check_layout(value, layout[1], where)
        return
    if isinstance(layout, dict):
        assert isinstance(value, dict), f"{where} is {value!r}, not an object"
        assert list(value) == list(layout), f"{where} fields {list(value)} != {list(layout)}"
        for key, inner in layout.items():
            check_layout(value[key], inner, f"{where}.{key}")
        return
    assert isinstance(value, layout) and not (
        isinstance(value, bool) and layout in (int, NUMBER)
    ), f"{where} = {value!r} is not {layout}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    artifact = make_random_artifact(
        LLAMA, tmp_path_factory.mktemp("art") / "tiny.ninfer", seed=3, name=MODEL
    )
    config = EngineConfig(max_concurrency=2, max_context=1024, prefill_chunk=64)
    log_path = tmp_path_factory.mktemp("log") / "requests.jsonl"
    telemetry = Telemetry(request_log=RequestLog(log_path))
    running = start_server(AsyncEngine.open(artifact, config), telemetry=telemetry)
    running.log_path = log_path
    yield running
    running.stop()


def _chat(server, text: str, **body) -> dict[str, Any]:
    reply = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": text}], **body},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    return {**reply.json(), "x-request-id": reply.headers["x-request-id"]}


def _done_records(server, count: int) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]]:
        lines = server.log_path.read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines]
        return [r for r in records if r["event"] == "request_done"]

    wait_for(lambda: len(done()) >= count)
    return done()


def test_request_done_has_every_field_in_order(server, caplog):
    long_prompt = " ".join(f"word{i}" for i in range(120))
    with caplog.at_level("INFO", logger="ninfer.server"):
        replies = [
            _chat(server, "hi", temperature=0, max_tokens=5),
            _chat(server, long_prompt, temperature=0, max_tokens=4),
            _chat(server, long_prompt, temperature=0, max_tokens=4),
            _chat(server, "json", response_format={"type": "json_object"}, max_tokens=8),
        ]
        records = _done_records(server, len(replies))[-len(replies) :]
    done_lines = [
        r.getMessage() for r in caplog.records if " done: chat/completions" in r.getMessage()
    ]
    hit = records[2]["result"]["prefix_cache_hit_tokens"]
    share = 100 * hit // records[2]["result"]["prompt_tokens"]
    # The console's completion record: `cache N (P%, path)`, rounded; JSONL has the exact fields.
    assert f"req#{records[2]['request_id']} done: chat/completions" in done_lines[2]
    assert f", cache {hit} ({share}%, hybrid snapshot), " in done_lines[2]
    assert ", cache 0, " in done_lines[1]
    for record in records:
        check_layout(record, REQUEST_DONE)
        assert record["schema"] == SCHEMA and record["schema_version"] == SCHEMA_VERSION == 26
        result = record["result"]
        assert len(result["generated_token_ids"]) == result["completion_tokens"]
        hit = result["prefix_cache_hit_tokens"]
        assert result["prefill_tokens"] == result["prompt_tokens"] - hit
        timings = record["timings_seconds"]
        assert 0 <= timings["prepare"] <= timings["ttft"] <= timings["total"]
        assert record["generation"]["scheduling"]["preemptions"] == 0  # no memory pressure
    for record, reply in zip(records, replies, strict=True):
        usage = reply["usage"]
        assert record["http_request_id"] == reply["x-request-id"]
        assert record["result"]["prompt_tokens"] == usage["prompt_tokens"]
        assert record["result"]["completion_tokens"] == usage["completion_tokens"]
        assert record["result"]["finish_reason"] == reply["choices"][0]["finish_reason"]
    first_long, repeated = records[1]["result"], records[2]["result"]
    assert first_long["prefix_reuse_path"] == "root" and first_long["prefix_cache_hit_tokens"] == 0
    assert repeated["prefix_cache_hit_tokens"] >= 64  # whole 64-token blocks were reused
    assert repeated["prefix_reuse_path"] != "root"
    assert records[0]["constraint"] is None
    constraint = records[3]["constraint"]
    assert constraint == replies[3]["constraint"]  # the same observation as the HTTP result
