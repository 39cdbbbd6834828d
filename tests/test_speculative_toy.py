"""Speculative rounds over the weightless ToyModel: proposals from a known continuation (the
draft oracle) prove that accepted tokens are committed whole rounds at a time, that a rejection
commits exactly the accepted prefix plus the correction, that stops and max_tokens inside a
round end exactly where plain decoding ends, and that sampling keeps the target distribution
(the same tokens per seed as without speculation, and a chi-square on a tiny vocabulary)."""

from __future__ import annotations

import math
import random

import pytest

from toy_engine import collect, make_engine, run_one, submit_ok

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _prompt(seed: int, n: int = 20, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _output_events(outcome) -> list:
    return [ev for ev in outcome.events if ev.token_ids]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_an_oracle_that_agrees_commits_k_plus_one_tokens_per_round(k):
    prompt = _prompt(k)
    plain = run_one(make_engine(), prompt, 40, **GREEDY)
    engine = make_engine(ngram_draft_tokens=k)
    spec = run_one(engine, prompt, 40, draft_oracle=plain.tokens, **GREEDY)
    assert spec.tokens == plain.tokens
    # The first token comes from the prefill; each later round commits k + 1 tokens, the last
    # round what the output cap leaves.
    assert len(_output_events(spec)) == 1 + math.ceil(39 / (k + 1))
    assert spec.final.draft_n == spec.final.draft_n_accepted > 0
    stats = engine.stats()
    rounds = math.ceil(39 / (k + 1))
    last = 39 - (k + 1) * (rounds - 1)  # a last round of one token has nothing to verify
    assert stats["decode_rounds"] == rounds
    assert stats["spec_rounds"] == rounds - (last == 1)
    assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"] == spec.final.draft_n
    assert stats["tokens_decoded"] == 40
    assert stats["decode_tokens"] == 39
    assert stats["spec_ngram_rounds"] == 0  # oracle proposals are not n-gram copies
    tally = spec.final.speculative  # the request log's request_done.speculative
    assert tally["rounds"] == stats["spec_rounds"]
    assert tally["drafted_tokens"] == tally["accepted_tokens"] == spec.final.draft_n
    assert tally["fallback_steps"] == (last == 1) == stats["spec_fallback_steps"]
    assert sum(tally["accepted_per_position"]) == tally["accepted_tokens"]
    assert tally["accepted_per_position"][0] == tally["rounds"]
    assert all(ev.speculative is None for ev in spec.events[:-1])


@pytest.mark.parametrize("reject_at", [0, 1, 2])
def test_a_rejection_commits_the_accepted_prefix_and_the_correction(reject_at):
    prompt, k = _prompt(7), 3
    plain = run_one(make_engine(), prompt, 41, **GREEDY)
    # Every round's proposal reject_at is wrong: each round commits reject_at + 1 tokens.
    oracle = list(plain.tokens)
    wrong = [(t + 1) % 256 for t in oracle]
    pos = 1
    while pos < len(oracle):
        if pos + reject_at < len(oracle):
            oracle[pos + reject_at] = wrong[pos + reject_at]
        pos += reject_at + 1
    engine = make_engine(ngram_draft_tokens=k)
    spec = run_one(engine, prompt, 41, draft_oracle=oracle, **GREEDY)
    assert spec.tokens == plain.tokens
    sizes = [len(ev.token_ids) for ev in _output_events(spec)]
    assert sizes[0] == 1
    assert all(n == reject_at + 1 for n in sizes[1:-1]), sizes
    assert spec.final.draft_n_accepted == reject_at * (len(sizes) - 1) or sizes[-1] < reject_at + 1


def test_always_wrong_proposals_commit_one_token_per_round():
    prompt = _prompt(3)
    plain = run_one(make_engine(), prompt, 25, **GREEDY)
    spec = run_one(
        make_engine(ngram_draft_tokens=4),
        prompt,
        25,
        draft_oracle=[(t + 5) % 256 for t in plain.tokens],
        **GREEDY,
    )
    assert spec.tokens == plain.tokens
    assert all(len(ev.token_ids) == 1 for ev in spec.events)
    assert spec.final.draft_n > 0 and spec.final.draft_n_accepted == 0
    assert spec.final.speculative["accepted_per_position"] == [0, 0, 0, 0]


def test_stops_and_max_tokens_inside_a_round_end_like_plain_decoding():
    prompt = _prompt(11)
    reference = run_one(make_engine(), prompt, 60, **GREEDY).tokens
    cases = [
        {"max_tokens": 10},  # the cap lands inside a 6-token round
        {"max_tokens": 60, "stop_token_ids": [reference[13]]},
        {"max_tokens": 60, "stop_strings": [bytes([32 + reference[17] % 95]).decode()]},
        {"max_tokens": 60, "min_tokens": 15, "stop_token_ids": [reference[8]]},
    ]
    for case in cases:
        kw = dict(case)
        max_tokens = kw.pop("max_tokens")
        plain = run_one(make_engine(), prompt, max_tokens, **GREEDY, **kw)
        spec = run_one(
            make_engine(ngram_draft_tokens=5),
            prompt,
            max_tokens,
            draft_oracle=reference,
            **GREEDY,
            **kw,
        )
        assert spec.tokens == plain.tokens, case
        assert spec.text == plain.text, case
        assert spec.final.finish_reason == plain.final.finish_reason, case
        assert spec.final.stop_reason == plain.final.stop_reason, case
        assert spec.final.completion_tokens == plain.final.completion_tokens == len(plain.tokens)


def test_seeded_sampling_gives_the_same_tokens_as_without_speculation():
    prompt = _prompt(5, vocab=16)
    options = dict(
        temperature=0.9,
        top_k=5,
        top_p=0.95,
        min_p=0.02,
        presence_penalty=0.3,
        frequency_penalty=0.2,
        ignore_eos=True,
    )
    for seed in range(12):
        plain = run_one(make_engine(vocab=16), prompt, 30, seed=seed, **options)
        # Proposals right half of the time: rounds of every acceptance length.
        rng = random.Random(seed)
        oracle = [t if rng.random() < 0.6 else (t + 1) % 16 for t in plain.tokens]
        spec = run_one(
            make_engine(vocab=16, ngram_draft_tokens=3),
            prompt,
            30,
            seed=seed,
            draft_oracle=oracle,
            **options,
        )
        assert spec.tokens == plain.tokens, seed


def _toy_next(sequence: list[int], vocab: int) -> int:
    """The ToyModel's peak token after `sequence` (toy_model.h)."""
    pos = len(sequence) - 1
    mix = sum(t * (i % 13 + 1) for i, t in enumerate(sequence))
    return (31 * sequence[-1] + 7 * pos + mix) % vocab


def test_rejection_sampling_keeps_the_target_distribution():
    vocab, draws = 8, 3000
    prompt = [1, 2, 3, 4, 5]
    weights = [math.exp(6), math.exp(4), math.exp(3)] + [1.0] * (vocab - 3)
    expected = [w / sum(weights) * draws for w in weights]
    engine = make_engine(vocab=vocab, max_concurrency=8, ngram_draft_tokens=2)
    counts = [0] * vocab
    ids = []
    for seed in range(draws):
        # A fixed proposal for the second token, whatever the first: accepted when the sample
        # equals it, else corrected; either way the committed token must follow the target p.
        ids.append(
            submit_ok(
                engine,
                prompt,
                3,
                temperature=1.0,
                seed=seed,
                ignore_eos=True,
                draft_oracle=[0, 3, 5],
            )
        )
        if len(ids) == 8 or seed == draws - 1:
            for outcome in collect(engine, ids).values():
                first, second = outcome.tokens[:2]
                peak = _toy_next(prompt + [first], vocab)
                counts[(second - peak) % vocab] += 1
            ids = []
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected, strict=True))
    assert chi2 < 24.3, (chi2, counts)  # p > 1e-3 at 7 degrees of freedom
    assert engine.stats()["spec_rounds"] > 0


def test_speculative_options_are_checked():
    with pytest.raises(ValueError, match="MTP draft tokens"):
        make_engine(mtp_draft_tokens=6)
    with pytest.raises(ValueError, match="n-gram draft tokens"):
        make_engine(ngram_draft_tokens=64)
    with pytest.raises(ValueError, match="min match"):
        make_engine(ngram_draft_tokens=3, ngram_min_match=3)
    with pytest.raises(ValueError, match="MTP head"):
        make_engine(mtp_draft_tokens=2)
    with pytest.raises(ValueError, match="it needs mtp_draft_tokens"):
        make_engine(ngram_draft_tokens=3, lm_head_draft_tokens=128)
    with pytest.raises(ValueError, match="must not be negative"):
        make_engine(mtp_draft_tokens=2, lm_head_draft_tokens=-1)


def test_ngram_proposals_are_copied_from_the_prompt_and_verified():
    # A prompt whose last three tokens plus the model's first output occurred earlier: the
    # tokens that followed them there are proposed (and verified; acceptance is the model's).
    rng = random.Random(4)
    while True:
        tail, first = [rng.randrange(256) for _ in range(3)], rng.randrange(256)
        copied = [rng.randrange(256) for _ in range(6)]
        prompt = [rng.randrange(256) for _ in range(8)] + tail + [first] + copied + tail
        if _toy_next(prompt, 256) == first:
            break
    plain = run_one(make_engine(), prompt, 20, **GREEDY)
    engine = make_engine(ngram_draft_tokens=6, ngram_min_match=4)
    spec = run_one(engine, prompt, 20, **GREEDY)
    assert spec.tokens == plain.tokens
    stats = engine.stats()
    assert stats["spec_ngram_rounds"] >= 1
    assert stats["spec_ngram_draft_tokens"] == stats["spec_draft_tokens"] == spec.final.draft_n >= 6


@pytest.mark.parametrize("lanes", [1, 4])
def test_device_sampling_of_verified_rows_matches_the_host_path(lanes):
    # Penalties over the proposals and min_tokens by row position, on both paths.
    options = dict(temperature=0.8, top_k=6, min_p=0.01, frequency_penalty=0.4, min_tokens=5)
    prompts = [_prompt(s, n=5 + 3 * s, vocab=32) for s in range(6)]
    results = {}
    for device in (False, True):
        engine = make_engine(vocab=32, max_concurrency=lanes, ngram_draft_tokens=3, eos_ids=[0, 1])
        engine.toy_sample_on_device(device)
        plain = make_engine(vocab=32, max_concurrency=lanes, eos_ids=[0, 1])
        plain.toy_sample_on_device(device)
        runs = []
        for e, oracle in ((plain, False), (engine, True)):
            ids = []
            for i, p in enumerate(prompts):
                kw = dict(options, seed=i)
                if oracle:
                    reference = results[(device, "plain")][i]
                    kw["draft_oracle"] = [
                        t if j % 3 else (t + 1) % 32 for j, t in enumerate(reference)
                    ]
                ids.append(submit_ok(e, p, 24, **kw))
            got = collect(e, ids)
            runs.append([got[i].tokens for i in ids])
            results[(device, "plain")] = runs[0]
        assert runs[1] == runs[0], device
        results[device] = runs[1]
    assert results[True] == results[False]


@pytest.mark.parametrize("limit", [0, 2, 5, 9])
def test_a_thinking_cap_inside_a_round_commits_the_close_like_plain_decoding(limit):
    prompt, close = [5, 17, 42, 99, 3, 250, 7], [11, 12, 13]
    thinking = dict(thinking_budget=limit, thinking_open=True, think_close_id=12,
                    thinking_close_ids=close)  # fmt: skip
    plain = run_one(make_engine(), prompt, 30, temperature=0.0, **thinking)
    assert plain.tokens[limit : limit + 3] == close
    # The oracle knows the whole answer, close sequence included: rounds span the cap.
    engine = make_engine(ngram_draft_tokens=4)
    spec = run_one(engine, prompt, 30, temperature=0.0, draft_oracle=plain.tokens, **thinking)
    assert spec.tokens == plain.tokens
    assert spec.final.draft_n_accepted > 0
    # And with wrong proposals for the close sequence itself.
    wrong = [(t + 1) % 256 if limit <= i < limit + 3 else t for i, t in enumerate(plain.tokens)]
    spec = run_one(make_engine(ngram_draft_tokens=4), prompt, 30, temperature=0.0,
                   draft_oracle=wrong, **thinking)  # fmt: skip
    assert spec.tokens == plain.tokens
