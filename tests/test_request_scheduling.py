"""Pause/restore boundaries: the core's scheduling events under KV pressure (ToyModel), their
counters, and the request log's request_scheduling records."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from ninfer.engine_types import EngineEvent, GenerationRequest, Timings
from ninfer.server.request_log import RequestLog
from ninfer.server.telemetry import Telemetry

pytest.importorskip("ninfer._core")
from toy_engine import VOCAB, collect, make_engine, submit_ok  # noqa: E402

NEXT = {  # the transitions that may follow each one
    "start": {"pause_started"},
    "pause_started": {"paused"},
    "paused": {"restore_started"},
    "restore_started": {"restored"},
    "restored": {"replay_complete", "pause_started"},
    "replay_complete": {"recovery_complete", "pause_started"},
    "recovery_complete": {"pause_started"},
}


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _contended_run() -> tuple[dict, dict]:
    # Four requests that each grow to ~5 pages share a pool of 10: younger ones are paused
    # and replayed (as in test_prefix_cache).
    engine = make_engine(max_concurrency=4, max_context=512, prefill_chunk=32, kv_capacity=640)
    try:
        ids = [submit_ok(engine, _prompt(40 + i, 90 + 17 * i), 150, ignore_eos=True)
               for i in range(4)]  # fmt: skip
        return collect(engine, ids, timeout=60), engine.stats()
    finally:
        engine.shutdown()


def test_pauses_publish_their_boundaries_and_counters():
    for _ in range(5):  # submits are sequential: on a busy machine nothing may have to pause
        outcomes, stats = _contended_run()
        if stats["pauses"] > 0:
            break
    assert stats["pauses"] > 0
    assert stats["replay_restores"] == stats["pauses"]  # every paused request came back
    assert stats["replayed_tokens"] > 0 and stats["replaying"] == 0 and stats["paused"] == 0
    total_preemptions = total_replayed = 0
    for outcome in outcomes.values():
        final = outcome.final
        assert final.finished and final.finish_reason == "length"  # the last event
        transitions = [e.transition for e in outcome.events if e.kind == "scheduling"]
        preemptions = final.scheduling["preemptions"]
        total_preemptions += preemptions
        total_replayed += final.scheduling["replayed_tokens"]
        names = [t["transition"] for t in transitions]
        state = "start"
        for name in names:  # each cycle in order (a restored request may be paused again)
            assert name in NEXT[state], (state, names)
            state = name
        assert state in ("start", "recovery_complete"), names  # it decoded after its replay
        assert names.count("paused") == preemptions
        if not transitions:
            assert final.scheduling["paused_seconds"] == 0
            continue
        assert final.scheduling["paused_seconds"] > 0
        assert [t["preemption_index"] for t in transitions if t["transition"] == "paused"] == list(
            range(1, preemptions + 1)
        )
        for t in transitions:  # pause_started: not chosen yet (a request may pause again)
            assert t["route"] == (None if t["transition"] == "pause_started" else "replay"), t
        steady = [t["steady_ns"] for t in transitions]
        assert steady == sorted(steady)
        assert all(t["elapsed_ns"] > 0 for t in transitions)
        for before, after in zip(transitions, transitions[1:], strict=False):
            for scope in ("global", "request"):
                for key, value in before["progress"][scope].items():
                    assert after["progress"][scope][key] >= value, (scope, key)
        replay_done = [t for t in transitions if t["transition"] == "replay_complete"][-1]
        assert (
            replay_done["progress"]["request"]["replayed_tokens"]
            == (final.scheduling["replayed_tokens"])
        )
    assert total_preemptions == stats["pauses"]
    assert total_replayed == stats["replayed_tokens"]


def test_request_log_records_the_boundaries_and_a_terminal_one(tmp_path):
    path = tmp_path / "log.jsonl"
    log = RequestLog(path)
    telemetry = Telemetry(request_log=log)
    log.start(telemetry.base("server_start"))
    request = SimpleNamespace(request_id="req_x", path="/v1/chat/completions")
    record = telemetry.start(
        request, GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=4), None, engine_request_id=7
    )
    progress = {"prefill_tokens": 3, "decode_tokens": 1, "replayed_tokens": 0}
    for name in ("pause_started", "paused"):
        telemetry.scheduling(
            7,
            {
                "transition": name,
                "preemption_index": 1,
                "route": None if name == "pause_started" else "replay",
                "steady_ns": 10,
                "elapsed_ns": 5,
                "progress": {"global": progress, "request": progress},
            },
        )
    telemetry.scheduling(8, {"transition": "paused"})  # another server's request: ignored
    record.final = EngineEvent(
        request_id=7,
        token_ids=[5],
        text=b"x",
        finished=True,
        finish_reason="length",
        prompt_tokens=3,
        completion_tokens=4,
        timings=Timings(1.0, 2.0, 3.0, 1.5),
        scheduling={"preemptions": 1, "replayed_tokens": 4, "paused_seconds": 0.25},
    )
    record.generated_token_ids = [5, 5, 5, 5]
    telemetry.settle(record, disconnected=False, response_failed=False, stopping=False)
    log.close()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["event"] for r in records] == [
        "server_start",
        "request_start",
        "request_scheduling",
        "request_scheduling",
        "request_scheduling",
        "request_done",
    ]
    paused = records[3]
    assert paused["request_id"] == record.number and paused["http_request_id"] == "req_x"
    assert paused["transition"] == "paused" and paused["route"] == "replay"
    assert paused["progress"]["request"] == progress
    terminal = records[4]
    assert terminal["transition"] == "terminal" and terminal["preemption_index"] == 1
    scheduling = records[5]["generation"]["scheduling"]
    assert scheduling["preemptions"] == scheduling["replay_restores"] == 1
    assert scheduling["replayed_tokens"] == 4 and scheduling["paused_seconds"] == 0.25
    telemetry.scheduling(7, {"transition": "paused"})  # settled: nothing more is written
    assert len(path.read_text(encoding="utf-8").splitlines()) == len(records)
