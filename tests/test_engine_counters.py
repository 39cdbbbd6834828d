"""The core's published counters and gauges (what /metrics formats), over the ToyModel."""

from __future__ import annotations

import pytest

pytest.importorskip("ninfer._core")
from toy_engine import collect, make_engine, submit_ok, wait_events, wait_until  # noqa: E402


def test_token_and_outcome_counters():
    engine = make_engine(max_concurrency=2, max_pending=1)
    try:
        ids = [submit_ok(engine, [1, 2, 3], 5, ignore_eos=True),
               submit_ok(engine, [4, 5], 1, ignore_eos=True)]  # fmt: skip
        outcomes = collect(engine, ids)
        stats = engine.stats()
        assert stats["prompt_tokens"] == 5 and stats["tokens_prefilled"] == 5
        assert stats["prompt_tokens_cached"] == 0
        assert stats["tokens_decoded"] == 6  # every committed token
        assert stats["decode_tokens"] == 4  # those after each request's first
        assert stats["finished_length"] == 2 and stats["finished_stop"] == 0
        assert stats["decode_rounds"] >= 4
        final = outcomes[ids[0]].final
        assert 0 < final.decode_share_ms <= final.predicted_ms + 1e-6
        assert outcomes[ids[1]].final.decode_share_ms == 0  # one token: no decode round
    finally:
        engine.shutdown()


def test_cancel_timeout_and_refusal_counters():
    engine = make_engine(max_concurrency=1, max_pending=1, pending_timeout_ms=100)
    engine.toy_set_step_delay_us(20_000)
    try:
        busy = submit_ok(engine, [1], 400, ignore_eos=True)
        waiting = submit_ok(engine, [2], 4)
        refused = engine.submit([3], 4)
        assert refused.status == "overloaded"
        wait_until(lambda: engine.stats()["queue_timeouts"] == 1)
        stats = engine.stats()
        assert stats["running"] == 1 and stats["decode_ready"] + stats["prefilling"] == 1
        engine.cancel(busy)
        wait_until(lambda: engine.stats()["finished_cancelled"] == 1)
        stats = engine.stats()
        assert stats["submits_refused"] == 1
        assert stats["finished_length"] == 0 and stats["finished_error"] == 0
        assert waiting != busy
    finally:
        engine.shutdown()


def test_injected_failures_take_the_recovery_path():
    engine = make_engine(max_concurrency=1)
    try:
        engine.inject_step_failures(1, out_of_memory=True)
        oom = collect(engine, [submit_ok(engine, [1], 3)])
        engine.inject_step_failures(1)
        failed = collect(engine, [submit_ok(engine, [1], 3)])
        ok = collect(engine, [submit_ok(engine, [1], 3, ignore_eos=True)])
        (oom_final,) = [o.final for o in oom.values()]
        (failed_final,) = [o.final for o in failed.values()]
        assert oom_final.error.startswith("model step failed: out of memory: ")
        assert failed_final.error == "model step failed: injected failed internal check"
        assert [o.final.finish_reason for o in ok.values()] == ["length"]
        stats = engine.stats()
        assert stats["recoveries_out_of_memory"] == 1 and stats["recoveries_failed_step"] == 1
        assert stats["finished_error"] == 2 and stats["healthy"]
        engine.inject_step_failures(8)
        for _ in range(8):
            collect(engine, [submit_ok(engine, [1], 3)])
        wait_until(lambda: not engine.healthy)
        assert engine.submit([1], 3).status == "unavailable"
        wait_events(engine, 0.01)
    finally:
        engine.shutdown()


def test_submit_reports_the_seed_it_samples_with():
    engine = make_engine(max_concurrency=1)
    try:
        given = engine.submit([1], 2, seed=1234, temperature=1.0)
        drawn = [engine.submit([1], 2, temperature=1.0) for _ in range(2)]
        assert given.seed == 1234
        assert drawn[0].seed != drawn[1].seed  # fresh entropy for each request without one
        collect(engine, [given.request_id] + [d.request_id for d in drawn])
    finally:
        engine.shutdown()
