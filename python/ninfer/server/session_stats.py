"""Aggregates over finished requests: what the statistics panel shows (all-time, last ten).

Ratios and rates divide summed tokens by summed seconds, so each request weighs by its size.
Decode seconds are each request's share of its batched rounds (the engine splits a round's
time over the tokens it computed), so concurrent requests add up to the aggregate rate; the
mean batch is decode wall time over decode share time, which weights every round by its
duration.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RequestSample:
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    prefill_s: float
    decode_tokens: int  # output tokens after the first
    decode_share_s: float
    decode_wall_s: float
    # Speculative work (request_done.speculative): the model drafter's (MTP) part and the
    # n-gram part, in accepted / drafted tokens and verification rounds.
    model_accepted: int = 0
    model_drafted: int = 0
    model_rounds: int = 0
    ngram_accepted: int = 0
    ngram_drafted: int = 0
    ngram_rounds: int = 0

    @classmethod
    def speculative_fields(cls, tally: dict | None) -> dict[str, int]:
        """The speculative fields from a finished event's tally (None: no speculative work)."""
        if not tally:
            return {}
        ngram = (
            tally.get("ngram_accepted_tokens", 0),
            tally.get("ngram_drafted_tokens", 0),
            tally.get("ngram_rounds", 0),
        )
        return {
            "model_accepted": tally.get("accepted_tokens", 0) - ngram[0],
            "model_drafted": tally.get("drafted_tokens", 0) - ngram[1],
            "model_rounds": tally.get("rounds", 0) - ngram[2],
            "ngram_accepted": ngram[0],
            "ngram_drafted": ngram[1],
            "ngram_rounds": ngram[2],
        }


@dataclass(slots=True)
class Aggregate:
    requests: int = 0
    ttft_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_share_s: float = 0.0
    decode_wall_s: float = 0.0
    model_accepted: int = 0
    model_drafted: int = 0
    model_rounds: int = 0
    ngram_accepted: int = 0
    ngram_drafted: int = 0
    ngram_rounds: int = 0

    def add(self, sample: RequestSample) -> None:
        self.requests += 1
        self.ttft_s += sample.ttft_s
        self.prompt_tokens += sample.prompt_tokens
        self.cached_tokens += sample.cached_tokens
        self.prefill_tokens += sample.prompt_tokens - sample.cached_tokens
        self.prefill_s += sample.prefill_s
        self.decode_tokens += sample.decode_tokens
        self.decode_share_s += sample.decode_share_s
        self.decode_wall_s += sample.decode_wall_s
        self.model_accepted += sample.model_accepted
        self.model_drafted += sample.model_drafted
        self.model_rounds += sample.model_rounds
        self.ngram_accepted += sample.ngram_accepted
        self.ngram_drafted += sample.ngram_drafted
        self.ngram_rounds += sample.ngram_rounds

    @classmethod
    def of(cls, samples: list[RequestSample]) -> Aggregate:
        total = cls()
        for sample in samples:
            total.add(sample)
        return total

    @property
    def mean_ttft_s(self) -> float | None:
        return self.ttft_s / self.requests if self.requests else None

    @property
    def prefill_rate(self) -> float | None:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else None

    @property
    def decode_rate(self) -> float | None:
        return self.decode_tokens / self.decode_share_s if self.decode_share_s > 0 else None

    @property
    def accepted_per_round(self) -> float | None:
        """Model-drafter accepted tokens per model-drafted round (n-gram rounds excluded)."""
        return self.model_accepted / self.model_rounds if self.model_rounds else None

    @property
    def mean_batch(self) -> float | None:
        return self.decode_wall_s / self.decode_share_s if self.decode_share_s > 0 else None


@dataclass(slots=True)
class SessionStats:
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    rejected: int = 0
    all_time: Aggregate = field(default_factory=Aggregate)
    recent: deque[RequestSample] = field(default_factory=lambda: deque(maxlen=10))

    def add_completed(self, sample: RequestSample) -> None:
        self.completed += 1
        self.all_time.add(sample)
        self.recent.append(sample)

    def last_ten(self) -> Aggregate | None:
        """Shown once more than ten requests have completed."""
        return Aggregate.of(list(self.recent)) if self.completed > 10 else None
