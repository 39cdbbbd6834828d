"""The asyncio bridge (ninfer.engine.AsyncEngine) over a toy core."""

from __future__ import annotations

import asyncio
import gc
import random

import pytest

from ninfer.engine import AsyncEngine
from ninfer.engine_types import (
    ContextLengthExceeded,
    EngineOverloaded,
    EngineUnavailable,
    GenerationRequest,
    QueueTimeout,
    SamplingParams,
)
from toy_engine import VOCAB, make_engine, run_one


def _engine(**options) -> AsyncEngine:
    return AsyncEngine(make_engine(**options))


async def _stream(handle) -> tuple[list[int], bytes, list]:
    tokens, text, events = [], b"", []
    async for event in handle:
        tokens += event.token_ids
        text += event.text
        events.append(event)
    return tokens, text, events


def _request(rng: random.Random, i: int) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 90))],
        max_tokens=rng.randrange(5, 50),
        sampling=SamplingParams(temperature=0.0 if i % 2 else 0.9, top_k=i % 4, seed=100 + i),
        stop_strings=["Q"] if i == 3 else [],
    )


def test_concurrent_streams_match_the_core_alone():
    rng = random.Random(8)
    requests = [_request(rng, i) for i in range(8)]
    core = make_engine()
    alone = []
    for r in requests:
        s = r.sampling
        out = run_one(
            core,
            r.prompt_ids,
            r.max_tokens,
            temperature=s.temperature,
            top_k=s.top_k,
            seed=s.seed,
            stop_strings=r.stop_strings,
        )
        alone.append((out.tokens, out.text, out.final.finish_reason))
    core.shutdown()

    async def main():
        engine = _engine(max_concurrency=8)
        handles = [engine.submit(r) for r in requests]
        results = await asyncio.gather(*(_stream(h) for h in handles))
        for handle in handles:
            await handle.admitted()  # already admitted: returns at once
        stats = engine.stats()
        await engine.close()
        return results, stats

    results, stats = asyncio.run(main())
    assert [(t, x, ev[-1].finish_reason) for t, x, ev in results] == alone
    for tokens, _, events in results:
        assert events[-1].finished and not any(e.finished for e in events[:-1])
        assert events[-1].completion_tokens == len(tokens)
        assert events[-1].timings is not None
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_submit_refusals_are_typed():
    async def main():
        engine = _engine(max_concurrency=1, max_pending=1, max_context=32)
        engine._core.toy_set_step_delay_us(2000)
        with pytest.raises(ContextLengthExceeded) as info:
            engine.submit(GenerationRequest(prompt_ids=[1] * 40, max_tokens=4))
        assert (info.value.prompt_tokens, info.value.max_context) == (40, 32)
        with pytest.raises(ValueError, match="top_p"):
            engine.submit(GenerationRequest([1], 4, SamplingParams(top_p=0.0)))
        with pytest.raises(ValueError, match="max_tokens"):
            engine.submit(GenerationRequest([1], -3))
        first = engine.submit(GenerationRequest([1], 30))
        second = engine.submit(GenerationRequest([2], 30))
        with pytest.raises(EngineOverloaded):
            engine.submit(GenerationRequest([3], 30))
        first.cancel()
        second.cancel()
        await engine.close()
        with pytest.raises(EngineUnavailable):
            engine.submit(GenerationRequest([3], 30))
        assert not engine.healthy

    asyncio.run(main())


def test_queue_timeout_raises_from_admitted_and_iteration():
    async def main():
        engine = _engine(max_concurrency=1, max_pending=2, pending_timeout_ms=40)
        engine._core.toy_set_step_delay_us(2000)
        busy = engine.submit(GenerationRequest([1], 1000))
        await busy.admitted()
        waiting = engine.submit(GenerationRequest([2], 10))
        with pytest.raises(QueueTimeout):
            await waiting.admitted()
        with pytest.raises(QueueTimeout):
            await _stream(waiting)
        busy.cancel()
        tokens, _, events = await _stream(busy)
        assert events[-1].finish_reason == "cancelled"
        await engine.close()

    asyncio.run(main())


def test_cancel_running_and_pending():
    async def main():
        engine = _engine(max_concurrency=1, max_pending=2)
        engine._core.toy_set_step_delay_us(1000)
        running = engine.submit(GenerationRequest([1], 1000))
        pending = engine.submit(GenerationRequest([2], 10))
        await running.admitted()
        pending.cancel()
        with pytest.raises(EngineUnavailable, match="cancelled"):
            await pending.admitted()
        got = 0
        async for event in running:
            got += len(event.token_ids)
            if got >= 3:
                running.cancel()
                running.cancel()
            if event.finished:
                assert event.finish_reason == "cancelled"
        await asyncio.sleep(0.05)
        stats = engine.stats()
        await engine.close()
        return stats

    stats = asyncio.run(main())
    assert stats["running"] == 0 and stats["pending"] == 0
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_abandoned_handle_is_cancelled():
    async def main():
        engine = _engine(max_concurrency=1)
        engine._core.toy_set_step_delay_us(1000)
        handle = engine.submit(GenerationRequest([1], 1000))
        async for _ in handle:
            break  # consumer walks away
        del handle
        gc.collect()
        for _ in range(200):
            await asyncio.sleep(0.005)
            if engine.stats()["running"] == 0:
                break
        stats = engine.stats()
        # The lane is free again for the next request.
        tokens, _, events = await _stream(engine.submit(GenerationRequest([2], 3)))
        await engine.close()
        return stats, events

    stats, events = asyncio.run(main())
    assert stats["running"] == 0 and stats["kv_pages_free"] == stats["kv_pages_total"]
    assert events[-1].finish_reason == "length"


def test_close_fails_running_and_pending_requests():
    async def main():
        engine = _engine(max_concurrency=1, max_pending=2)
        engine._core.toy_set_step_delay_us(1000)
        running = engine.submit(GenerationRequest([1], 1000))
        await running.admitted()
        pending = engine.submit(GenerationRequest([2], 10))
        await engine.close()
        with pytest.raises(EngineUnavailable, match="shutting down"):
            await pending.admitted()
        _, _, events = await _stream(running)
        assert events[-1].finish_reason == "error" and "shutting down" in events[-1].error

    asyncio.run(main())


def test_warmup_and_metadata():
    async def main():
        engine = _engine(max_context=256)
        await engine.warmup()
        stats = engine.stats()
        await engine.close()
        return engine, stats

    engine, stats = asyncio.run(main())
    assert stats["requests_finished"] == 1 and stats["tokens_decoded"] == 2
    assert engine.max_context == 256
    assert engine.model_info["n_ctx"] == 256 and engine.model_info["n_vocab"] == VOCAB


def test_warmup_of_a_whole_prefill_chunk():
    """ninfer-serve's GPU warm-up: a chunk-sized prompt and 4 tokens, capped by the context."""

    async def main():
        engine = _engine(max_context=256)
        await engine.warmup(prompt_tokens=64, max_tokens=4)
        first = engine.stats()
        await engine.warmup(prompt_tokens=10_000, max_tokens=4)  # capped to fit the context
        second = engine.stats()
        await engine.close()
        return first, second

    first, second = asyncio.run(main())
    assert first["requests_finished"] == 1 and first["tokens_decoded"] == 4
    assert first["prompt_tokens"] == 64
    assert second["prompt_tokens"] - first["prompt_tokens"] == 252


def test_async_context_manager_cancels_on_exit():
    async def main():
        engine = _engine(max_concurrency=1)
        engine._core.toy_set_step_delay_us(1000)
        async with engine.submit(GenerationRequest([1], 1000)) as handle:
            await handle.admitted()
        events = [e async for e in handle]
        await engine.close()
        return events

    events = asyncio.run(main())
    assert events[-1].finish_reason == "cancelled"


def test_huge_budgets_are_capped_by_the_context():
    async def main():
        engine = _engine(max_context=40)
        handle = engine.submit(
            GenerationRequest(
                [1, 2],
                10**12,
                SamplingParams(temperature=0.5, top_k=10**10, seed=2**70 + 5),
                ignore_eos=True,
                min_tokens=10**11,
            )
        )
        tokens, _, events = await _stream(handle)
        await engine.close()
        return tokens, events

    tokens, events = asyncio.run(main())
    assert len(tokens) == 38 and events[-1].finish_reason == "length"


def test_step_failures_are_logged_and_health_follows_the_core(caplog):
    async def main():
        engine = _engine(max_concurrency=1, max_pending=16)
        engine._core.toy_fail_next_forwards(1)
        _, _, events = await _stream(engine.submit(GenerationRequest([1], 3)))
        assert events[-1].finish_reason == "error"
        assert engine.healthy
        _, _, events = await _stream(engine.submit(GenerationRequest([1], 3)))
        assert events[-1].finish_reason != "error"  # a success resets the failure count
        engine._core.toy_fail_next_forwards(8)
        for _ in range(8):
            _, _, events = await _stream(engine.submit(GenerationRequest([1], 3)))
            assert events[-1].finish_reason == "error"
        for _ in range(500):  # generous: CI machines are busy
            if not engine.healthy:
                break
            await asyncio.sleep(0.01)
        healthy = engine.healthy
        with pytest.raises(EngineUnavailable, match="8 failed steps"):
            engine.submit(GenerationRequest([1], 3))
        await engine.close()
        return healthy

    with caplog.at_level("WARNING", logger="ninfer.engine"):
        assert asyncio.run(main()) is False
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("engine | worker recovering from a failed request") for m in messages)
    assert any(m.startswith("engine | engine stopped") for m in messages)


def test_engine_follows_a_new_event_loop():
    engine = _engine(max_context=128)

    async def one() -> list[int]:
        tokens, _, _ = await _stream(
            engine.submit(GenerationRequest([5, 6], 4, SamplingParams(temperature=0.0)))
        )
        return tokens

    first = asyncio.run(one())  # e.g. warmup in its own loop
    second = asyncio.run(one())  # then serving in another
    asyncio.run(engine.close())
    assert first == second and len(first) == 4


def test_prompt_progress_events_follow_prefill_chunks_and_coalesce_for_a_slow_reader():
    prompt = list(range(1, 71))  # prefill_chunk 16: commits at 16, 32, 48, 64, then 70

    async def main(pause: float):
        engine = _engine()
        handle = engine.submit(GenerationRequest(prompt, 2, report_progress=True))
        await handle.admitted()
        if pause:
            await asyncio.sleep(pause)  # the whole prompt commits before anything is read
        seen = []
        async for event in handle:
            seen.append(event)
        quiet = engine.submit(GenerationRequest(prompt, 2))
        plain = [event async for event in quiet]
        await engine.close()
        return seen, plain

    seen, plain = asyncio.run(main(0.0))
    progress = [e.prompt_processed for e in seen if e.prompt_processed is not None]
    assert progress == sorted(set(progress)) and set(progress) <= {16, 32, 48, 64}
    assert progress[-1] == 64  # coalescing keeps the newest frontier
    assert all(not e.token_ids for e in seen if e.prompt_processed is not None)
    assert sum(len(e.token_ids) for e in seen) == 2
    assert all(e.prompt_processed is None for e in plain)  # only when asked for

    slow, _ = asyncio.run(main(0.5))
    slow_progress = [e.prompt_processed for e in slow if e.prompt_processed is not None]
    assert slow_progress == [64]  # one event, carrying the newest frontier


def test_next_within_times_out_without_losing_events():
    """A quiet engine (each step 30 ms) answers next_within(5 ms) with None, and the stream
    still yields every token; with_heartbeat beats in the gaps and yields the same events."""
    from ninfer.server.sse import with_heartbeat

    async def main():
        engine = _engine()
        engine._core.toy_set_step_delay_us(30_000)
        request = GenerationRequest(
            prompt_ids=[5, 6, 7], max_tokens=4, sampling=SamplingParams(temperature=0.0)
        )
        handle = engine.submit(request)
        await handle.admitted()
        events, timeouts = [], 0
        while True:
            try:
                event = await handle.next_within(0.005)
            except StopAsyncIteration:
                break
            if event is None:
                timeouts += 1
            else:
                events.append(event)
        beats = []

        async def beat():
            beats.append(1)

        again = engine.submit(request)
        await again.admitted()
        relayed = [e async for e in with_heartbeat(again, 0.005, beat)]
        await engine.close()
        return events, timeouts, relayed, len(beats)

    events, timeouts, relayed, beats = asyncio.run(main())
    tokens = [t for e in events for t in e.token_ids]
    assert len(tokens) == 4 and events[-1].finished and timeouts >= 3
    assert [t for e in relayed for t in e.token_ids] == tokens and beats >= 3
    assert events[-1].timings is not None  # only the finished event carries timings
    assert all(e.timings is None for e in events[:-1])


def test_next_within_times_out_while_waiting_for_a_lane():
    async def main():
        engine = _engine()  # one lane
        engine._core.toy_set_step_delay_us(20_000)
        greedy = SamplingParams(temperature=0.0)
        first = engine.submit(GenerationRequest(prompt_ids=[1], max_tokens=5, sampling=greedy))
        second = engine.submit(GenerationRequest(prompt_ids=[2], max_tokens=2, sampling=greedy))
        waits = 0
        while await second.next_within(0.005) is None:
            waits += 1
        rest = [e async for e in second]
        await _stream(first)
        await engine.close()
        return waits, rest

    waits, rest = asyncio.run(main())
    assert waits >= 3  # the first request held the lane for ~100 ms
    assert rest and rest[-1].finished
