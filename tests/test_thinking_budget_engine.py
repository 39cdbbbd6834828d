"""The engine's thinking-token cap over the native ToyModel (CPU): at the cap the close
sequence is committed without sampling, at exactly that position, then sampling resumes."""

from __future__ import annotations

import pytest

from toy_engine import make_engine, run_one

PROMPT = [5, 17, 42, 99, 3, 250, 7]
OUTPUT = 40
CLOSE = [11, 12, 13]  # guidance, close marker, line break (stand-ins)
CLOSE_ID = 12


@pytest.fixture(scope="module")
def engine():
    eng = make_engine(max_concurrency=2)
    yield eng
    eng.shutdown()


def budget(limit, **kw):
    return {
        "thinking_budget": limit,
        "thinking_open": kw.pop("open", True),
        "think_close_id": kw.pop("close_id", CLOSE_ID),
        "thinking_close_ids": kw.pop("close_ids", CLOSE),
        **kw,
    }


@pytest.fixture(scope="module")
def free(engine):
    """The unconstrained greedy output; the test ids must not occur in its first tokens."""
    tokens = run_one(engine, PROMPT, OUTPUT, temperature=0.0).tokens
    assert len(tokens) == OUTPUT
    assert not set(CLOSE) & set(tokens[:20]), "pick close ids the toy does not produce"
    return tokens


def test_cap_commits_the_close_at_exactly_the_budget(engine, free):
    out = run_one(engine, PROMPT, OUTPUT, temperature=0.0, **budget(10))
    assert out.tokens[:10] == free[:10]
    assert out.tokens[10:13] == CLOSE
    assert len(out.tokens) == OUTPUT  # forced tokens count against max_tokens
    assert out.final.finish_reason == "length"
    assert out.final.completion_tokens == OUTPUT


def test_the_model_continues_from_the_forced_tokens(engine, free):
    capped = run_one(engine, PROMPT, OUTPUT, temperature=0.0, **budget(10)).tokens
    # The same sequence as a prompt gives the same continuation: the forced tokens entered
    # the model's state exactly as prompt tokens would.
    resumed = run_one(engine, PROMPT + capped[:13], OUTPUT - 13, temperature=0.0).tokens
    assert capped[13:] == resumed


def test_a_budget_of_zero_closes_before_the_first_sampled_token(engine):
    out = run_one(engine, PROMPT, 8, temperature=0.0, **budget(0))
    assert out.tokens[:3] == CLOSE


def test_natural_close_before_the_cap_forces_nothing(engine, free):
    out = run_one(engine, PROMPT, OUTPUT, temperature=0.0, **budget(10, close_id=free[4]))
    assert out.tokens == free


def test_cap_at_the_output_limit_has_no_effect(engine, free):
    out = run_one(engine, PROMPT, 10, temperature=0.0, **budget(10))
    assert out.tokens == free[:10]


def test_thinking_closed_at_the_start_is_never_capped(engine, free):
    out = run_one(engine, PROMPT, OUTPUT, temperature=0.0, **budget(3, open=False))
    assert out.tokens == free


def test_model_opened_thinking_counts_from_its_opener(engine, free):
    opener = free[2]
    assert opener not in free[:2]
    kw = budget(5, open=False, think_open_id=opener)
    out = run_one(engine, PROMPT, OUTPUT, temperature=0.0, **kw)
    assert out.tokens[:8] == free[:8]  # the opener at 2, then five thinking tokens
    assert out.tokens[8:11] == CLOSE


def test_forced_tokens_stream_as_text(engine):
    out = run_one(engine, PROMPT, 20, temperature=0.0, **budget(4))
    token_bytes = [bytes(b) for b in _toy_bytes()]
    assert out.text == b"".join(token_bytes[t] for t in out.tokens)


def _toy_bytes():
    from toy_engine import ascii_token_bytes

    return ascii_token_bytes()


@pytest.mark.parametrize("on_device", [False, True])
def test_sampled_requests_reproduce_and_match_across_sampling_paths(on_device):
    eng = make_engine(max_concurrency=1)
    try:
        eng.toy_sample_on_device(on_device)
        kw = dict(temperature=0.9, seed=77, **budget(6))
        first = run_one(eng, PROMPT, 30, **kw).tokens
        assert first[6:9] == CLOSE or CLOSE_ID in first[:6]
        assert run_one(eng, PROMPT, 30, **kw).tokens == first
        eng.toy_sample_on_device(not on_device)
        assert run_one(eng, PROMPT, 30, **kw).tokens == first
    finally:
        eng.shutdown()


def test_invalid_budgets_are_refused(engine):
    result = engine.submit(PROMPT, 8, thinking_budget=3, thinking_open=True)
    assert not result.accepted
    assert "close sequence" in result.message
    result = engine.submit(PROMPT, 8, **budget(3, close_ids=[1, 100000]))
    assert not result.accepted
    assert "outside the vocabulary" in result.message
