"""The CPU collective group that tensor-parallel ranks share (native/parallel/collective.h):
ranks are threads over shared memory. All-reduce gives every rank the same sum (taken in rank
order, so bit-identical across ranks); all-gather concatenates in rank order; a sequence of
collectives reuses the group."""

from __future__ import annotations

import numpy as np
import pytest

_core = pytest.importorskip("ninfer._core")


def _inputs(ranks: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(ranks * 1000 + n)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(ranks)]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_all_reduce_sums_in_rank_order_on_every_rank(ranks):
    inputs = _inputs(ranks, 1000)
    expected = inputs[0].copy()
    for x in inputs[1:]:
        expected += x  # float32, rank order: what every rank must hold exactly
    for out in _core.run_cpu_collectives(inputs, ["all_reduce"]):
        assert np.array_equal(out, expected)


@pytest.mark.parametrize("ranks", [2, 4])
def test_all_gather_concatenates_in_rank_order(ranks):
    inputs = _inputs(ranks, 37)
    for out in _core.run_cpu_collectives(inputs, ["all_gather"]):
        assert np.array_equal(out, np.concatenate(inputs))


def test_collectives_in_sequence_reuse_the_group():
    inputs = _inputs(3, 64)
    outs = _core.run_cpu_collectives(inputs, ["all_reduce"] * 50 + ["all_gather", "all_reduce"])
    expected = inputs[0].copy()
    for x in inputs[1:]:
        expected += x
    for _ in range(49):  # every rank holds the same sum, so each further reduce triples it
        expected = expected + expected + expected
    expected = np.concatenate([expected] * 3)
    expected = expected + expected + expected
    for out in outs:
        np.testing.assert_allclose(out, expected, rtol=1e-5)
    assert all(np.array_equal(outs[0], out) for out in outs[1:])


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one size"):
        uneven = [np.zeros(3, np.float32), np.zeros(4, np.float32)]
        _core.run_cpu_collectives(uneven, ["all_reduce"])
    with pytest.raises(ValueError, match="unknown collective"):
        _core.run_cpu_collectives([np.zeros(3, np.float32)], ["broadcast"])
