"""The native Sampler against a numpy reference of the same filter definitions."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer import _core

DRAWS = 20000


def _probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


def _reference(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """Distribution after top_k -> top_p -> min_p, each on the temperature-scaled softmax."""
    p = _probs(logits, temperature)
    keep = np.ones_like(p, dtype=bool)
    order = np.argsort(-p, kind="stable")
    if 0 < top_k < len(p):
        keep[:] = False
        keep[order[:top_k]] = True
    if top_p < 1.0:
        kept = order[keep[order]]
        cumulative = np.cumsum(p[kept]) / p[kept].sum()
        count = int(np.searchsorted(cumulative, top_p)) + 1
        keep[:] = False
        keep[kept[:count]] = True
    if min_p > 0:
        keep &= p >= min_p * p.max()
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def _check_frequencies(samples: np.ndarray, expected: np.ndarray) -> None:
    counts = np.bincount(samples, minlength=len(expected))
    outside = counts[expected == 0].sum()
    assert outside == 0, f"{outside} draws outside the allowed set"
    n = len(samples)
    # Five-sigma binomial bound per token: loose enough never to flake, tight enough to
    # catch a wrong renormalisation or a filter that keeps the wrong tokens.
    sigma = np.sqrt(n * expected * (1 - expected)) + 1
    assert np.all(np.abs(counts - n * expected) <= 5 * sigma), (counts, n * expected)


@pytest.fixture
def logits() -> np.ndarray:
    return np.random.default_rng(7).normal(0, 2.0, 64).astype(np.float32)


def test_greedy_is_argmax():
    rng = np.random.default_rng(1)
    sampler = _core.Sampler(temperature=0.0)
    for _ in range(200):
        row = rng.normal(0, 3, 1000).astype(np.float32)
        assert sampler.sample(row) == int(np.argmax(row))


def test_temperature_matches_softmax(logits):
    for temperature in (0.5, 1.0, 1.7):
        samples = _core.Sampler(temperature=temperature, seed=3).sample_many(logits, DRAWS)
        _check_frequencies(samples, _reference(logits, temperature))


@pytest.mark.parametrize("top_k", [1, 2, 5, 20])
def test_top_k_never_leaves_its_set(logits, top_k):
    samples = _core.Sampler(top_k=top_k, seed=top_k).sample_many(logits, DRAWS)
    expected = _reference(logits, top_k=top_k)
    assert np.count_nonzero(expected) == top_k
    _check_frequencies(samples, expected)


def _safe_top_p(logits: np.ndarray, index: int, temperature: float = 1.0) -> float:
    """A top_p halfway between two cumulative masses, so rounding cannot move the cut."""
    p = np.sort(_probs(logits, temperature))[::-1]
    cumulative = np.cumsum(p)
    return float((cumulative[index] + cumulative[index + 1]) / 2)


@pytest.mark.parametrize("index", [0, 2, 6, 20])
def test_top_p_never_leaves_its_set(logits, index):
    top_p = _safe_top_p(logits, index)
    samples = _core.Sampler(top_p=top_p, seed=index).sample_many(logits, DRAWS)
    expected = _reference(logits, top_p=top_p)
    assert np.count_nonzero(expected) == index + 2
    _check_frequencies(samples, expected)


def test_top_p_on_a_large_flat_vocabulary():
    # The kept set runs past the sampler's first partial-sort window (64).
    row = np.random.default_rng(2).normal(0, 0.1, 5000).astype(np.float32)
    top_p = _safe_top_p(row, 300)
    samples = _core.Sampler(top_p=top_p, seed=5).sample_many(row, 5000)
    expected = _reference(row, top_p=top_p)
    assert np.count_nonzero(expected) == 302
    assert set(np.unique(samples)) <= set(np.flatnonzero(expected))


@pytest.mark.parametrize("min_p", [0.05, 0.3, 0.9])
def test_min_p_never_leaves_its_set(logits, min_p):
    samples = _core.Sampler(min_p=min_p, seed=4).sample_many(logits, DRAWS)
    _check_frequencies(samples, _reference(logits, min_p=min_p))


def test_filters_combine_in_order(logits):
    temperature = 0.8
    top_p = _safe_top_p(logits[:], 8, temperature)
    kw = {"temperature": temperature, "top_k": 12, "top_p": top_p, "min_p": 0.02}
    samples = _core.Sampler(seed=9, **kw).sample_many(logits, DRAWS)
    _check_frequencies(samples, _reference(logits, **kw))


def test_same_seed_same_draws_and_different_seed_differs(logits):
    a = _core.Sampler(seed=42).sample_many(logits, 500)
    b = _core.Sampler(seed=42).sample_many(logits, 500)
    c = _core.Sampler(seed=43).sample_many(logits, 500)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_presence_and_frequency_penalties_shift_greedy_choice():
    row = np.array([2.0, 1.5, 0.0], dtype=np.float32)
    greedy = {"temperature": 0.0}
    assert _core.Sampler(**greedy).sample(row) == 0
    assert _core.Sampler(presence_penalty=0.6, **greedy).sample(row, {0: 1}) == 1
    assert _core.Sampler(presence_penalty=0.4, **greedy).sample(row, {0: 5}) == 0
    assert _core.Sampler(frequency_penalty=0.2, **greedy).sample(row, {0: 2}) == 0  # 1.6
    assert _core.Sampler(frequency_penalty=0.2, **greedy).sample(row, {0: 3}) == 1  # 1.4
    assert _core.Sampler(presence_penalty=-1.0, **greedy).sample(row, {2: 1}) == 0  # 1.0


def test_penalties_change_the_distribution_as_defined(logits):
    history = {int(np.argmax(logits)): 3, 5: 1, 9: 2}
    presence, frequency = 0.7, 0.3
    adjusted = logits.astype(np.float64).copy()
    for token, count in history.items():
        adjusted[token] -= presence + frequency * count
    samples = _core.Sampler(
        presence_penalty=presence, frequency_penalty=frequency, seed=1
    ).sample_many(logits, DRAWS, history)
    _check_frequencies(samples, _reference(adjusted))


def test_suppressed_tokens_are_never_chosen():
    row = np.array([5.0, 4.0, 3.0, -1.0], dtype=np.float32)
    assert _core.Sampler(temperature=0.0).sample(row, {}, [0, 1]) == 2
    sampler = _core.Sampler(seed=3)
    assert all(sampler.sample(row, {}, [0]) != 0 for _ in range(500))


def test_unusable_logits_raise():
    with pytest.raises(RuntimeError, match="NaN"):
        _core.Sampler().sample(np.array([1.0, np.nan], dtype=np.float32))
    with pytest.raises(RuntimeError, match="no token"):
        _core.Sampler().sample(np.array([1.0, 2.0], dtype=np.float32), {}, [0, 1])


def test_top_p_cut_inside_a_tied_flat_tail():
    # Three strong tokens over thousands of equal ones: the cut lands deep in the tie, which
    # lower ids win. Exercises the selection path beyond the sorted heads.
    row = np.zeros(20000, dtype=np.float32)
    row[[17, 4000, 12345]] = [6.0, 4.0, 3.0]
    p = _probs(row, 1.0)
    tail = p[0]
    head_mass = p[[17, 4000, 12345]].sum()
    keep_tail = 3000
    top_p = float(head_mass + (keep_tail + 0.5) * tail)
    samples = _core.Sampler(top_p=top_p, seed=8).sample_many(row, 4000)
    expected = _reference(row, top_p=top_p)
    allowed = set(np.flatnonzero(expected))
    assert len(allowed) == 3 + keep_tail + 1
    assert set(np.unique(samples)) <= allowed
    assert {17, 4000, 12345} <= allowed and 3001 in allowed and 3002 not in allowed
