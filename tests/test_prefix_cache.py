"""The prefix cache and the shared KV pool over the ToyModel: hits reuse whole 64-token
blocks, eviction order, blocks shared by concurrent requests, pause and replay under a tiny
pool, and no page leaks. The toy's logits depend on every cached token read back through the
page table, so a wrong mapping changes the outputs."""

from __future__ import annotations

import random

from toy_engine import VOCAB, collect, make_engine, run_one, submit_ok, wait_until

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _idle_and_consistent(engine) -> dict:
    stats = engine.stats(check_cache=True)
    assert stats["cache_problem"] == ""
    assert stats["running"] == 0 and stats["pending"] == 0 and stats["paused"] == 0
    assert stats["kv_pages_free"] == stats["kv_pages_total"]  # nothing leaked
    return stats


def test_second_request_reuses_whole_blocks_and_matches_a_cold_run():
    prompt = _prompt(1, 200)
    cold_engine = make_engine(prefix_reuse=False)
    cold = run_one(cold_engine, prompt, 20, **GREEDY)
    assert cold.final.cached_tokens == 0
    cold_engine.shutdown()

    engine = make_engine()
    first = run_one(engine, prompt, 20, **GREEDY)
    second = run_one(engine, prompt, 20, **GREEDY)
    assert first.final.cached_tokens == 0
    assert second.final.cached_tokens == 192  # three whole blocks; the rest is recomputed
    assert first.tokens == second.tokens == cold.tokens
    stats = _idle_and_consistent(engine)
    assert stats["prefix_cache"]["hits"] == 1
    assert stats["prefix_cache"]["reused_tokens"] == 192
    # The first request published its prompt and answer blocks: (200 + 20 - 1) // 64 = 3.
    assert stats["prefix_cache"]["blocks_inserted"] == 3
    engine.shutdown()


def test_hit_leaves_at_least_one_token_to_compute():
    engine = make_engine()
    prompt = _prompt(2, 128)
    run_one(engine, prompt, 1, **GREEDY)
    again = run_one(engine, prompt, 1, **GREEDY)
    # 128 tokens are cached, but the last one must run to give logits: one block is reused.
    assert again.final.cached_tokens == 64
    longer = run_one(engine, prompt + [5], 1, **GREEDY)
    assert longer.final.cached_tokens == 128
    _idle_and_consistent(engine)
    engine.shutdown()


def test_a_follow_up_turn_reuses_the_answer_it_extends():
    engine = make_engine()
    prompt = _prompt(3, 150)
    first = run_one(engine, prompt, 60, **GREEDY)
    turn2 = prompt + first.tokens + _prompt(4, 30)
    cold_engine = make_engine(prefix_reuse=False)
    cold = run_one(cold_engine, turn2, 10, **GREEDY)
    cold_engine.shutdown()
    second = run_one(engine, turn2, 10, **GREEDY)
    # prompt + answer forwarded 209 tokens: three blocks, all inside the new prompt.
    assert second.final.cached_tokens == 192
    assert second.tokens == cold.tokens
    _idle_and_consistent(engine)
    engine.shutdown()


def test_no_prefix_reuse_publishes_nothing():
    engine = make_engine(prefix_reuse=False)
    prompt = _prompt(5, 300)
    run_one(engine, prompt, 5, **GREEDY)
    again = run_one(engine, prompt, 5, **GREEDY)
    assert again.final.cached_tokens == 0
    stats = _idle_and_consistent(engine)
    assert stats["prefix_reuse"] is False
    assert stats["kv_pages_cached"] == 0
    engine.shutdown()


def test_eviction_takes_the_least_recently_used_unreferenced_leaves():
    # 10 pages. A, B, C (129 tokens: two published blocks each) leave 6 cached pages; D needs
    # 7 pages, so three blocks go, leaf first and oldest first: A's two, then B's second.
    engine = make_engine(kv_capacity=640, max_context=512)
    a, b, c, d = (_prompt(10 + i, n) for i, n in enumerate((129, 129, 129, 385)))
    for p in (a, b, c):
        run_one(engine, p, 1, **GREEDY)
    assert engine.stats(check_cache=True)["kv_pages_cached"] == 6
    run_one(engine, d, 1, **GREEDY)
    stats = engine.stats(check_cache=True)
    assert stats["prefix_cache"]["evicted_blocks"] == 3
    assert run_one(engine, c, 1, **GREEDY).final.cached_tokens == 128
    assert run_one(engine, b, 1, **GREEDY).final.cached_tokens == 64
    assert run_one(engine, a, 1, **GREEDY).final.cached_tokens == 0
    _idle_and_consistent(engine)
    engine.shutdown()


def test_concurrent_requests_share_cached_blocks():
    shared = _prompt(20, 256)
    suffixes = [_prompt(30 + i, 10 + 7 * i) for i in range(3)]
    cold_engine = make_engine(prefix_reuse=False, max_concurrency=3)
    expected = [run_one(cold_engine, shared + s, 40, **GREEDY).tokens for s in suffixes]
    cold_engine.shutdown()

    engine = make_engine(max_concurrency=3)
    engine.toy_set_step_delay_us(1000)
    run_one(engine, shared, 1, **GREEDY)  # publishes the four shared blocks
    ids = [submit_ok(engine, shared + s, 40, **GREEDY) for s in suffixes]
    wait_until(lambda: engine.stats(check_cache=True)["running"] == 3)
    during = engine.stats(check_cache=True)
    # The shared blocks are mapped by all three requests at once, and nothing is evictable.
    assert during["cache_problem"] == ""
    got = collect(engine, ids, timeout=30)
    assert [got[i].tokens for i in ids] == expected
    assert [got[i].final.cached_tokens for i in ids] == [256, 256, 256]
    assert during["prefix_cache"]["unreferenced_blocks"] < during["kv_pages_cached"]
    _idle_and_consistent(engine)
    engine.shutdown()


def _contended_run(**options):
    requests = [(_prompt(40 + i, 90 + 17 * i), 150, {"seed": 7 + i}) for i in range(4)]
    engine = make_engine(max_concurrency=4, max_context=512, prefill_chunk=32, **options)
    ids = [
        submit_ok(engine, p, n, temperature=0.9 if i % 2 else 0.0, ignore_eos=True, **kw)
        for i, (p, n, kw) in enumerate(requests)
    ]
    got = collect(engine, ids, timeout=60)
    stats = _idle_and_consistent(engine)
    engine.shutdown()
    return requests, [got[i] for i in ids], stats


def test_pause_and_replay_under_a_tiny_pool_match_an_uncontended_run():
    # Four requests that each grow to ~5 pages share a pool of 10 (640 tokens): the younger
    # ones are paused and replayed, never resampled, and nothing leaks.
    # The third run also has a host tier (16 pages): replays may read blocks back from it.
    for reuse, host in ((True, 0), (False, 0), (True, 16 * 512)):
        # The requests are submitted one by one: on a busy machine the worker can run the
        # first ones far enough before the last arrives that nothing has to pause, so the
        # run is repeated (a few times at most) until the pause path was taken.
        for _ in range(5):
            requests, outcomes, stats = _contended_run(
                kv_capacity=640, prefix_reuse=reuse, host_context_bytes=host
            )
            if stats["pauses"] > 0:
                break
        assert stats["pauses"] > 0
        assert stats["replay_restores"] > 0 and stats["replayed_tokens"] > 0
        alone = make_engine(max_context=512)
        for i, ((prompt, n, kw), got) in enumerate(zip(requests, outcomes, strict=True)):
            want = run_one(
                alone, prompt, n, temperature=0.9 if i % 2 else 0.0, ignore_eos=True, **kw
            )
            assert got.tokens == want.tokens, (reuse, i)
            assert got.final.finish_reason == "length"
            assert got.text == want.text
            # Paused requests report their tokens once: the events hold each token once.
            assert sum(len(e.token_ids) for e in got.events) == n
        alone.shutdown()


def test_prompt_beyond_the_pool_is_refused_with_the_capacity():
    engine = make_engine(kv_capacity=256, max_context=512)
    result = engine.submit(_prompt(6, 300), 4)
    assert result.status == "context_exceeded"
    assert result.max_context == 256
    assert "KV capacity" in result.message
    # Output is capped by the pool too.
    out = run_one(engine, _prompt(7, 200), 500, **GREEDY)
    assert out.final.finish_reason == "length"
    assert len(out.tokens) == 56
    engine.shutdown()


def test_random_mix_with_cancels_under_pressure_matches_uncontended_runs():
    # Shared prefixes of three conversations, eight lanes, a 12-page pool, random cancels:
    # hits, evictions and pause/replay all happen, and every request that was not cancelled
    # gives exactly what it gives alone.
    for trial in range(2):
        rng = random.Random(trial)
        bases = [[rng.randrange(VOCAB) for _ in range(300)] for _ in range(3)]
        requests = []
        for _ in range(20):
            base = rng.choice(bases)
            prompt = base[: rng.randrange(1, 300)] + _prompt(
                rng.randrange(1000), rng.randrange(1, 60)
            )
            requests.append((prompt, rng.randrange(1, 100)))
        alone = make_engine(max_context=512)
        want = [run_one(alone, p, n, **GREEDY).tokens for p, n in requests]
        alone.shutdown()
        engine = make_engine(
            max_concurrency=8,
            max_context=512,
            kv_capacity=12 * 64,
            prefill_chunk=48,
            max_pending=32,
        )
        engine.toy_set_step_delay_us(200)
        ids = [submit_ok(engine, p, n, **GREEDY) for p, n in requests]
        cancelled = set(rng.sample(ids, 4))
        for rid in cancelled:
            engine.cancel(rid)
        got = collect(engine, ids, timeout=60)
        stats = _idle_and_consistent(engine)
        engine.shutdown()
        assert stats["pauses"] > 0 and stats["prefix_cache"]["hits"] > 0
        for rid, tokens in zip(ids, want, strict=True):
            if rid not in cancelled:
                assert got[rid].tokens == tokens, (trial, rid)
