"""Readable units for console records and the statistics panel (the JSONL keeps full precision)."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1.0:
        return f"{seconds * 1000.0:.0f} ms"
    if seconds < 100.0:
        return f"{seconds:.2f} s"
    return f"{seconds:.0f} s"


def count(value: int) -> str:
    if value < 10_000:
        return str(value)
    if value < 10_000_000:
        return f"{value / 1000.0:.1f}K"
    return f"{value / 1_000_000.0:.1f}M"


def rate(tokens_per_s: float | None) -> str:
    if tokens_per_s is None:
        return "-"
    if tokens_per_s < 100.0:
        return f"{tokens_per_s:.1f} tok/s"
    if tokens_per_s < 10_000.0:
        return f"{tokens_per_s:.0f} tok/s"
    return f"{tokens_per_s / 1000.0:.1f}K tok/s"
