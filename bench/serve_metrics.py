"""Client-side serving metrics, defined as `vllm bench serve` defines them.

Every time is taken on the client with `time.perf_counter()`, per request:

- **TTFT** (time to first token): from just before the request is sent to the arrival of the
  first streamed event that carries output (reasoning or answer text).
- **ITL** (inter-token latency): the gaps between successive output-carrying events of one
  request after the first. A server that puts several tokens into one event yields one
  (longer) gap for them, exactly as vLLM's client measures it; ITL statistics pool the gaps
  of all requests.
- **E2EL** (end-to-end latency): from the send to the end of the stream.
- **TPOT** (time per output token, excluding the first): (E2EL - TTFT) / (output tokens - 1),
  for requests with more than one output token; statistics are over requests.
- Output tokens of a request: the server's usage count when the stream reports one, else the
  number of output-carrying events.

Beside those, when the server reports its own account of a request (llama.cpp's `timings`
object on the last chunk, which NInfer sends too): `server_prefill` is its prompt
processing time and `server_tpot` its decode time per token after the first, as the engine
clocked them (statistics over requests; keys `median_server_tpot_ms` etc., absent when no
request carried them). They put the client's figures beside the engine's for the same
requests, so the HTTP path's share is their difference.

Per run: request throughput = completed requests / duration, output throughput = output
tokens of completed requests / duration, total token throughput = (input + output tokens) /
duration, where the duration runs from the first request's scheduling to the last one's end.
Mean, median, standard deviation and percentiles use numpy (`np.percentile`'s linear
interpolation), and the JSON keys are vLLM's (`mean_ttft_ms`, `median_itl_ms`, `p99_tpot_ms`,
...), so result files compare directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
SERVER_METRICS = ("server_prefill", "server_tpot")


@dataclass
class RequestRecord:
    """What one request measured; times in seconds."""

    prompt_len: int  # input tokens of the dataset prompt (the template adds more)
    success: bool = False
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0  # E2EL
    output_tokens: int | None = None  # the server's usage count, when it sent one
    output_events: int = 0  # output-carrying events received
    served_prompt_tokens: int | None = None  # the server's usage count (template included)
    server_prompt_ms: float | None = None  # the server's own prefill time, when reported
    server_tpot_ms: float | None = None  # the server's own decode ms per token, when reported
    error: str = ""

    @property
    def output_len(self) -> int:
        return self.output_tokens if self.output_tokens is not None else self.output_events

    @property
    def tpot(self) -> float | None:
        if self.output_len <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)


def percentile_key(p: float) -> str:
    """vLLM's spelling of a percentile in result keys: 99 -> "p99", 99.9 -> "p99.9"."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def _stats(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    values = np.asarray(values_s, dtype=np.float64) * 1000.0  # reported in milliseconds
    if values.size == 0:
        values = np.zeros(1)
    out = {
        f"mean_{name}_ms": float(values.mean()),
        f"median_{name}_ms": float(np.median(values)),
        f"std_{name}_ms": float(values.std()),
    }
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = float(np.percentile(values, p))
    return out


def compute_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    percentiles: Sequence[float] = (50, 90, 99),
    metrics: Sequence[str] = PERCENTILE_METRICS,
) -> dict[str, Any]:
    """The run's summary, with vLLM's result keys."""
    if duration_s <= 0:
        raise ValueError("duration must be positive")
    done = [r for r in records if r.success]
    total_input = sum(r.prompt_len for r in done)
    total_output = sum(r.output_len for r in done)
    result: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
    }
    samples = {
        "ttft": [r.ttft for r in done],
        "tpot": [t for r in done if (t := r.tpot) is not None],
        "itl": [gap for r in done for gap in r.itl],
        "e2el": [r.latency for r in done],
    }
    for name in metrics:
        if name not in samples:
            raise ValueError(f"unknown metric {name!r}; known: {', '.join(PERCENTILE_METRICS)}")
        result.update(_stats(name, samples[name], percentiles))
    reported = {
        "server_prefill": [r.server_prompt_ms / 1e3 for r in done if r.server_prompt_ms],
        "server_tpot": [r.server_tpot_ms / 1e3 for r in done if r.server_tpot_ms],
    }
    for name in SERVER_METRICS:
        if reported[name]:
            result.update(_stats(name, reported[name], percentiles))
            result[f"{name}_requests"] = len(reported[name])
    return result


def per_request_fields(records: Sequence[RequestRecord]) -> dict[str, list[Any]]:
    """The per-request arrays vLLM saves beside the summary."""
    return {
        "input_lens": [r.prompt_len for r in records],
        "output_lens": [r.output_len if r.success else 0 for r in records],
        "ttfts": [r.ttft if r.success else 0.0 for r in records],
        "itls": [r.itl if r.success else [] for r in records],
        "server_prompt_ms": [r.server_prompt_ms if r.success else None for r in records],
        "server_tpot_ms": [r.server_tpot_ms if r.success else None for r in records],
        "errors": [r.error for r in records],
    }


def poisson_intervals(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """The wait after sending each request (the first goes at once) for `rate` requests/s:
    gamma-distributed with shape `burstiness` (1 = a Poisson process: exponential gaps) and
    mean 1 / rate, as vLLM schedules them; all zero for an infinite rate (all at once)."""
    if rate == float("inf"):
        return [0.0] * count
    if rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be positive")
    rng = np.random.default_rng(seed)
    theta = 1.0 / (rate * burstiness)
    return [float(x) for x in rng.gamma(shape=burstiness, scale=theta, size=count)]
