"""Random per-row sampling parameters for the device-sampling tests (host and GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer import _core

PARAMS = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty")


def random_row(rng: np.random.Generator, vocab: int) -> dict[str, Any]:
    """Sampling parameters of one row with every filter on or off at random."""
    row: dict[str, Any] = {
        "temperature": float(rng.choice([0.0, 0.3, 0.7, 1.0, 1.6])),
        "top_k": int(rng.choice([0, 0, 1, 2, 20, vocab // 2 + 1, vocab + 5])),
        "top_p": float(rng.choice([1.0, 1.0, 0.9, 0.5, 0.05])),
        "min_p": float(rng.choice([0.0, 0.0, 0.05, 0.3])),
        "uniform": float(rng.random()),
    }
    if rng.random() < 0.4:
        row["presence_penalty"] = float(rng.normal(0, 1))
        row["frequency_penalty"] = float(rng.normal(0, 0.5))
        tokens = rng.choice(vocab, size=min(vocab, 12), replace=False)
        row["penalties"] = {int(t): int(rng.integers(1, 5)) for t in tokens}
    if rng.random() < 0.4:
        row["suppressed"] = [int(t) for t in rng.integers(-2, vocab + 2, size=3)]
    return row


def with_draw(logits: np.ndarray, row: dict[str, Any]) -> int:
    """The Sampler's choice for one row and its draw."""
    sampler = _core.Sampler(**{k: row[k] for k in PARAMS if k in row})
    penalties, suppressed = row.get("penalties", {}), row.get("suppressed", [])
    return sampler.sample_with_draw(logits, penalties, suppressed, row["uniform"])
