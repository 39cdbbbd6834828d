"""Scheduler behaviour of the native engine over the ToyModel: batching invariance, chunked
prefill, page accounting, admission limits, timeouts, context ceiling, failure recovery."""

from __future__ import annotations

import random

import pytest

from toy_engine import VOCAB, collect, make_engine, run_one, submit_ok, wait_events, wait_until


def _mixed_requests(rng: random.Random) -> list[tuple[list[int], int, dict]]:
    """Eight requests with different prompt lengths, budgets and sampling settings."""
    params = [
        {"temperature": 0.0},
        {"temperature": 0.8, "seed": 11},
        {"temperature": 1.0, "top_k": 2, "seed": 12},
        {"temperature": 1.2, "top_p": 0.7, "seed": 13},
        {"temperature": 1.0, "min_p": 0.2, "seed": 14},
        {"temperature": 0.9, "presence_penalty": 1.0, "frequency_penalty": 0.5, "seed": 15},
        {"temperature": 0.0, "stop_strings": ["zz", "q", "5", "K", "a"], "min_tokens": 2},
        {"temperature": 1.0, "seed": 16, "stop_token_ids": list(range(3, VOCAB, 9))},
    ]
    out = []
    for p in params:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 150))]
        out.append((prompt, rng.randrange(1, 60), p))
    return out


def _outcomes_alone(requests: list[tuple[list[int], int, dict]], **engine_opts) -> list:
    engine = make_engine(max_concurrency=1, **engine_opts)
    try:
        return [run_one(engine, prompt, n, **kw) for prompt, n, kw in requests]
    finally:
        engine.shutdown()


def _outcomes_together(requests, **engine_opts) -> list:
    engine = make_engine(max_concurrency=8, **engine_opts)
    try:
        ids = [submit_ok(engine, prompt, n, **kw) for prompt, n, kw in requests]
        got = collect(engine, ids)
        assert engine.stats()["kv_pages_free"] == engine.stats()["kv_pages_total"]
        return [got[i] for i in ids]
    finally:
        engine.shutdown()


def _signature(outcome) -> tuple:
    final = outcome.final
    return (
        outcome.tokens,
        outcome.text,
        final.finish_reason,
        final.stop_reason,
        final.completion_tokens,
        final.prompt_tokens,
    )


def test_eight_concurrent_requests_match_each_alone():
    requests = _mixed_requests(random.Random(1234))
    alone = [_signature(o) for o in _outcomes_alone(requests)]
    together = [_signature(o) for o in _outcomes_together(requests)]
    assert together == alone
    # The mix really exercises different endings and lengths.
    assert len({s[2] for s in alone}) >= 2
    assert all(s[4] == len(s[0]) for s in alone)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1000])
def test_prefill_chunk_size_does_not_change_outputs(chunk):
    requests = _mixed_requests(random.Random(99))
    reference = [_signature(o) for o in _outcomes_together(requests, prefill_chunk=16)]
    assert [_signature(o) for o in _outcomes_together(requests, prefill_chunk=chunk)] == reference


def test_decode_batch_forms_while_requests_overlap():
    engine = make_engine(max_concurrency=4)
    # A slow first step holds the worker while the four requests queue up behind it.
    engine.toy_set_step_delay_us(200_000)
    blocker = submit_ok(engine, [9], 1)
    wait_until(lambda: engine.stats()["running"] == 1)
    ids = [submit_ok(engine, [i + 1, 2, 3], 40, temperature=0.0, ignore_eos=True) for i in range(4)]
    engine.toy_set_step_delay_us(0)
    collect(engine, [blocker, *ids])
    stats = engine.stats()
    engine.shutdown()
    assert stats["tokens_decoded"] == 161
    # 156 decode rows (each request's first token comes from prefill): one prefill step for
    # all four, then 39 steps of four rows each.
    assert stats["decode_rows"] == 156
    assert stats["steps"] == 1 + 1 + 39
    assert stats["tokens_prefilled"] == 13


def test_pages_return_after_cancel_mid_prefill_and_mid_decode():
    engine = make_engine(max_concurrency=2, prefill_chunk=2, max_context=2048, kv_capacity=4096)
    total = engine.stats()["kv_pages_total"]
    assert total == 4096 // 64
    engine.toy_set_step_delay_us(2000)
    # The short request first: prefill is FIFO, so it decodes (one row a step) while the long
    # prompt is still being prefilled two tokens a step (300 steps) when the cancels arrive.
    decoding = submit_ok(engine, [6, 7], 1500)
    prefilling = submit_ok(engine, [5] * 600, 10)
    seen_tokens = 0
    while seen_tokens < 3:
        seen_tokens += sum(
            len(e.token_ids) for e in wait_events(engine) if e.request_id == decoding
        )
    stats = engine.stats()
    assert stats["kv_pages_free"] < total
    assert stats["running"] == 2
    engine.cancel(prefilling)
    engine.cancel(decoding)
    engine.cancel(decoding)  # idempotent
    outcomes = collect(engine, [prefilling, decoding])
    assert outcomes[prefilling].final.finish_reason == "cancelled"
    assert outcomes[prefilling].tokens == []
    assert outcomes[decoding].final.finish_reason == "cancelled"
    assert 3 <= outcomes[decoding].final.completion_tokens < 1500
    stats = engine.stats()
    assert stats["kv_pages_free"] == total
    assert stats["running"] == 0 and stats["pending"] == 0
    engine.shutdown()


def test_pages_return_after_requests_finish():
    engine = make_engine(max_concurrency=3, max_context=300)
    total = engine.stats()["kv_pages_total"]
    ids = [
        submit_ok(engine, [1] * n, 250 - n, temperature=0.0, ignore_eos=True) for n in (1, 70, 200)
    ]
    outcomes = collect(engine, ids)
    assert [o.final.finish_reason for o in outcomes.values()] == ["length"] * 3
    assert engine.stats()["kv_pages_free"] == total
    engine.shutdown()


def test_cancel_pending_is_immediate():
    engine = make_engine(max_concurrency=1, max_pending=4)
    engine.toy_set_step_delay_us(2000)
    running = submit_ok(engine, [1, 2], 1000)
    wait_until(lambda: engine.stats()["running"] == 1)
    pending = submit_ok(engine, [3, 4], 10)
    assert engine.stats()["pending"] == 1
    engine.cancel(pending)
    events = engine.drain_events()  # pushed synchronously by cancel, no step needed
    finals = [e for e in events if e.request_id == pending]
    assert len(finals) == 1 and finals[0].finished and finals[0].finish_reason == "cancelled"
    assert engine.stats()["pending"] == 0
    engine.cancel(running)
    collect(engine, [running])
    engine.shutdown()


def test_overload_refused_when_lanes_and_pending_are_full():
    engine = make_engine(max_concurrency=2, max_pending=1)
    engine.toy_set_step_delay_us(2000)
    ids = [submit_ok(engine, [1], 1000) for _ in range(3)]
    refused = engine.submit([1], 5)
    assert refused.status == "overloaded" and not refused.accepted
    assert "2 lanes" in refused.message and "1 pending" in refused.message
    for rid in ids:
        engine.cancel(rid)
    collect(engine, ids)
    assert engine.submit([1], 1).accepted  # capacity returns with the finished requests
    engine.shutdown()


def test_pending_request_times_out():
    engine = make_engine(max_concurrency=1, max_pending=2, pending_timeout_ms=60)
    engine.toy_set_step_delay_us(2000)
    running = submit_ok(engine, [1], 1000)
    waiting = submit_ok(engine, [2], 5)
    events = collect(engine, [waiting], timeout=5)[waiting]
    assert not events.admitted
    (final,) = events.events
    assert final.kind == "queue_timeout" and final.finished
    assert "60 ms" in final.error
    assert final.queue_ms >= 60
    engine.cancel(running)
    collect(engine, [running])
    assert engine.stats()["kv_pages_free"] == engine.stats()["kv_pages_total"]
    engine.shutdown()


def test_admitted_request_is_not_timed_out():
    engine = make_engine(max_concurrency=1, pending_timeout_ms=30)
    engine.toy_set_step_delay_us(1000)
    out = run_one(engine, [1, 2], 60, ignore_eos=True)
    assert out.admitted and out.final.finish_reason == "length" and len(out.tokens) == 60
    engine.shutdown()


def test_context_ceiling():
    engine = make_engine(max_context=64)
    refused = engine.submit([1] * 64, 1)
    assert refused.status == "context_exceeded"
    assert (refused.prompt_tokens, refused.max_context) == (64, 64)
    assert "64 tokens" in refused.message
    refused = engine.submit([1] * 100, 0)
    assert refused.status == "context_exceeded" and refused.prompt_tokens == 100
    # Output is capped at the ceiling and ends with "length".
    out = run_one(engine, [1] * 60, 1000, temperature=0.0, ignore_eos=True)
    assert len(out.tokens) == 4 and out.final.finish_reason == "length"
    # A prompt that fills the context exactly may still be processed without output.
    out = run_one(engine, [1] * 64, 0)
    assert out.tokens == [] and out.final.finish_reason == "length"
    assert out.final.prompt_tokens == 64 and out.final.completion_tokens == 0
    engine.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"prompt_ids": []}, "at least one token"),
        ({"prompt_ids": [1, VOCAB]}, "outside the vocabulary"),
        ({"prompt_ids": [-1]}, "outside the vocabulary"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"min_tokens": -2}, "min_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": float("inf")}, "presence_penalty"),
        ({"stop_token_ids": [VOCAB + 5]}, "stop token id"),
        ({"stop_strings": [""]}, "stop strings"),
    ],
)
def test_bad_parameters_are_refused_with_a_reason(kwargs, fragment):
    engine = make_engine()
    args = {"prompt_ids": [1, 2], "max_tokens": 4} | kwargs
    result = engine.submit(args.pop("prompt_ids"), args.pop("max_tokens"), **args)
    assert result.status == "invalid" and fragment in result.message
    engine.shutdown()


def test_failed_step_fails_its_requests_and_engine_recovers():
    engine = make_engine(max_concurrency=2)
    engine.toy_fail_next_forwards(1)
    out = run_one(engine, [1, 2, 3], 5)
    assert out.final.finish_reason == "error" and "injected failure" in out.final.error
    assert engine.healthy
    out = run_one(engine, [1, 2, 3], 5, temperature=0.0, ignore_eos=True)
    assert out.final.finish_reason == "length" and len(out.tokens) == 5
    assert engine.stats()["kv_pages_free"] == engine.stats()["kv_pages_total"]
    engine.shutdown()


def test_eight_failures_in_a_row_stop_the_engine():
    engine = make_engine(max_concurrency=1, max_pending=16)
    engine.toy_fail_next_forwards(8)
    engine.toy_set_step_delay_us(20_000)  # all ten are queued before the eighth failure
    ids = [submit_ok(engine, [1, 2], 3) for _ in range(10)]
    outcomes = collect(engine, ids)
    assert all(o.final.finish_reason == "error" for o in outcomes.values())
    wait_until(lambda: not engine.healthy)
    refused = engine.submit([1], 1)
    assert refused.status == "unavailable" and "8 failed steps" in refused.message
    engine.shutdown()


def test_shutdown_fails_running_and_pending_requests():
    engine = make_engine(max_concurrency=1, max_pending=2)
    engine.toy_set_step_delay_us(2000)
    ids = [submit_ok(engine, [1], 1000) for _ in range(2)]
    wait_until(lambda: engine.stats()["running"] == 1)
    engine.shutdown()
    outcomes = collect(engine, ids)
    for o in outcomes.values():
        assert o.final.finish_reason == "error" and "shutting down" in o.final.error
    assert engine.submit([1], 1).status == "unavailable"
    assert engine.stats()["kv_pages_free"] == engine.stats()["kv_pages_total"]


def test_timings_and_counts_on_events():
    engine = make_engine(prefill_chunk=4)
    engine.toy_set_step_delay_us(500)
    out = run_one(engine, list(range(1, 30)), 8, temperature=0.0, ignore_eos=True)
    final = out.final
    assert final.prompt_tokens == 29 and final.completion_tokens == 8
    assert final.prompt_ms >= 0.5 * 7  # eight prefill steps of >= 0.5 ms
    assert final.predicted_ms >= 0.5 * 6
    assert final.queue_ms >= 0
    assert [e.completion_tokens for e in out.events] == list(range(1, 9))
    engine.shutdown()
