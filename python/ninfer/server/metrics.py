"""GET /metrics: the engine's published counters and the request histograms, in Prometheus text.

The counters and gauges live in the native engine (atomics the worker publishes); a scrape
copies one snapshot of them (`engine.stats()`) and formats it here, so scraping never waits
for a step, touches the device or resets anything. Latency histograms are observed from the
event stream by the request telemetry, where the HTTP-side timestamps are. Every family has
bounded labels: no request ids, no text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# `_created` series are an OpenMetrics notion; in the 0.0.4 text format they would only be
# extra gauges per histogram. (A process-wide switch: this server is the only exporter.)
disable_created_metrics()

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# engine.stats() key -> (metric name, help). Counters count from the moment this server's
# metrics were created (after warm-up), so the snapshot at creation is subtracted.
_TOKEN_COUNTERS = (
    ("prompt_tokens", "ninfer_prompt_tokens", "Prompt tokens of admitted requests"),
    (
        "prompt_tokens_cached",
        "ninfer_prompt_tokens_cached",
        "Prompt tokens reused from a cache instead of prefilled",
    ),
    (
        "replayed_tokens",
        "ninfer_replayed_tokens",
        "Tokens recomputed to restore paused requests (not in ninfer_prefill_tokens)",
    ),
    (
        "tokens_decoded",
        "ninfer_generation_tokens",
        "Committed output tokens, each request's first included",
    ),
    ("decode_tokens", "ninfer_decode_tokens", "Committed output tokens after each request's first"),
    (
        "spec_rounds",
        "ninfer_spec_decode_rounds",
        "Speculative rounds: decode rows that verified proposals",
    ),
    ("spec_draft_tokens", "ninfer_spec_decode_draft_tokens", "Speculative proposals verified"),
    (
        "spec_accepted_tokens",
        "ninfer_spec_decode_accepted_tokens",
        "Speculative proposals accepted",
    ),
    (
        "spec_fallback_steps",
        "ninfer_spec_decode_fallback_steps",
        "Decode rows of a speculating server that had no proposal to verify",
    ),
)

# requests_total outcome -> the engine counters it sums.
REQUEST_OUTCOMES: dict[str, tuple[str, ...]] = {
    "completed": ("finished_stop", "finished_length"),
    "cancelled": ("finished_cancelled",),
    "failed": ("finished_error",),
    "queue_timeout": ("queue_timeouts",),
    "rejected": ("submits_refused",),
}

_GAUGES = (
    ("running", "ninfer_requests_running", "Requests holding an execution lane"),
    ("pending", "ninfer_requests_waiting", "Requests waiting for a lane"),
    ("prefilling", "ninfer_requests_prefilling", "Resident requests still reading their prompt"),
    ("decode_ready", "ninfer_requests_decode_ready", "Resident requests ready for a decode round"),
    ("paused", "ninfer_requests_paused", "Requests paused for memory, waiting to be restored"),
    ("replaying", "ninfer_requests_replaying", "Resident requests rebuilding state after a pause"),
)

# Pressure pauses and how paused requests came back. Every restore replays: pause snapshots
# would need a host tier, so snapshot_restores stays 0 (it is exported so that a dashboard
# written for the full family set finds it).
_SCHEDULING_COUNTERS = (
    ("pauses", "ninfer_preemptions", "Requests paused to let an older request grow"),
    ("snapshot_restores", "ninfer_snapshot_restores", "Paused requests restored from a snapshot"),
    ("replay_restores", "ninfer_replay_restores", "Paused requests restored by replaying"),
)


# The engine worker's mutually exclusive host phases (engine.stats()["host_work_seconds"]).
HOST_WORK_PHASES = (
    "engine_boundary",
    "program_submit",
    "program_post",
    "engine_commit_output",
    "engine_maintenance",
)


class RequestHistograms:
    """Latency histograms of settled generations, in one registry per server."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.time_to_first_token = Histogram(
            "ninfer_time_to_first_token_seconds",
            "Request receipt to the first committed token (preparation, queueing, prefill)",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.request_duration = Histogram(
            "ninfer_request_duration_seconds",
            "Request receipt to its settled outcome (completed or cancelled)",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.request_queue = Histogram(
            "ninfer_request_queue_seconds",
            "Time a settled request waited for an execution lane",
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )


CONSTRAINT_OUTCOMES = ("terminated", "complete", "incomplete")
CONSTRAINT_CACHE_RESULTS = ("hit", "built", "waited")


class ConstraintCounters:
    """Grammar-constraint work of settled requests (completed or cancelled), added once per
    request from the matcher's counters on its final event."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, text, labelnames=labels, registry=registry)

        self.requests = counter(
            "ninfer_constraint_requests",
            "Settled constrained requests by completion state: terminated (the grammar "
            "accepted EOS), complete (it could end but did not), incomplete (cut inside it)",
            ("outcome",),
        )
        self.cache = counter(
            "ninfer_constraint_cache",
            "Compiled-grammar cache accesses of settled constrained requests",
            ("result",),
        )
        for outcome in CONSTRAINT_OUTCOMES:
            self.requests.labels(outcome)
        for result in CONSTRAINT_CACHE_RESULTS:
            self.cache.labels(result)
        self.prepare_seconds = counter(
            "ninfer_constraint_prepare_seconds", "Grammar compile, cache lookup or wait time"
        )
        self.mask_seconds = counter(
            "ninfer_constraint_mask_seconds", "CPU time filling next-token masks"
        )
        self.matcher_seconds = counter(
            "ninfer_constraint_matcher_seconds", "Time advancing matchers over committed tokens"
        )
        self.mask_positions = counter(
            "ninfer_constraint_mask_positions", "Output positions sampled under a mask"
        )
        self.mask_upload_bytes = counter(
            "ninfer_constraint_mask_upload_bytes", "Packed mask bytes handed to the sampler"
        )

    def observe(self, stats: Mapping[str, Any]) -> None:
        if stats.get("terminated"):
            outcome = "terminated"
        else:
            outcome = "complete" if stats.get("complete") else "incomplete"
        self.requests.labels(outcome).inc()
        result = stats.get("cache", "built")
        self.cache.labels(result if result in CONSTRAINT_CACHE_RESULTS else "built").inc()
        self.prepare_seconds.inc(max(0.0, float(stats.get("prepare_seconds", 0.0))))
        self.mask_seconds.inc(max(0.0, float(stats.get("mask_seconds", 0.0))))
        self.matcher_seconds.inc(max(0.0, float(stats.get("matcher_seconds", 0.0))))
        self.mask_positions.inc(max(0, int(stats.get("mask_positions", 0))))
        self.mask_upload_bytes.inc(max(0, int(stats.get("mask_upload_bytes", 0))))


class _EngineCollector:
    """Formats one engine snapshot per scrape."""

    def __init__(self, engine: Any, identity: Mapping[str, str], metrics: ServerMetrics) -> None:
        self._engine = engine
        self._identity = dict(identity)
        self._metrics = metrics
        self._baseline = _snapshot(engine)

    def collect(self) -> Iterator[Metric]:
        stats = _snapshot(self._engine)
        info = GaugeMetricFamily(
            "ninfer_model_info", "Model and backend identity", labels=list(self._identity)
        )
        info.add_metric(list(self._identity.values()), 1)
        yield info
        yield _gauge("ninfer_max_concurrency", "Execution lanes", stats.get("lanes", 0))
        yield _gauge(
            "ninfer_max_context_tokens",
            "Context ceiling of each sequence",
            getattr(self._engine, "max_context", 0),
        )
        for key, name, text in _GAUGES:
            yield _gauge(name, text, stats.get(key, 0))
        yield _counter(
            "ninfer_prefill_tokens",
            "Prompt tokens computed by initial prefill (cache hits and replays excluded)",
            max(
                0,
                self._since_start(stats, "tokens_prefilled")
                - self._since_start(stats, "replayed_tokens"),
            ),
        )
        for key, name, text in _TOKEN_COUNTERS:
            yield _counter(name, text, self._since_start(stats, key))
        for key, name, text in _SCHEDULING_COUNTERS:
            yield _counter(name, text, self._since_start(stats, key))
        requests = CounterMetricFamily(
            "ninfer_requests",
            "Generation attempts that reached the engine, by outcome",
            labels=["outcome"],
        )
        for outcome, keys in REQUEST_OUTCOMES.items():
            requests.add_metric([outcome], sum(self._since_start(stats, key) for key in keys))
        yield requests
        yield _counter(
            "ninfer_response_failures",
            "Responses that failed after their generation was accepted",
            self._metrics.response_failures,
        )
        total = int(stats.get("kv_pages_total", 0))
        yield _gauge("ninfer_device_kv_capacity_pages", "Main KV pool pages", total)
        yield _gauge(
            "ninfer_device_kv_used_pages",
            "Main KV pool pages in use",
            total - int(stats.get("kv_pages_free", total)),
        )
        # Device state images: one per lane plus the prefix cache's snapshot slots, which
        # retained history occupies as requests do (hybrid models; 0 for pure attention).
        cache = stats.get("prefix_cache") or {}
        lanes_total = int(stats.get("state_slots_total", 0))
        yield _gauge(
            "ninfer_device_state_capacity_slots",
            "Recurrent-state images: lanes plus prefix-cache snapshot slots (hybrid models)",
            lanes_total + (int(cache.get("snapshot_slots", 0)) if lanes_total else 0),
        )
        yield _gauge(
            "ninfer_device_state_used_slots",
            "Recurrent-state images holding a request or a cached snapshot",
            int(stats.get("state_slots_used", 0))
            + (int(cache.get("snapshots", 0)) if lanes_total else 0),
        )
        yield from self._host_context(stats)
        yield from self._worker_time(stats)
        yield _gauge(
            "ninfer_requests_materializing",
            "Requests whose context is copied in from the host tier (0: copies are synchronous)",
            0,
        )
        # The output-constraint families (ninfer_constraint_*) and the speculative-decoding
        # families (ninfer_spec_decode_*) are exported by those features, after this point.
        yield _gauge(
            "ninfer_engine_ready",
            "1 while the engine accepts work, 0 after an engine-wide failure",
            1 if _healthy(self._engine) else 0,
        )

    def _host_context(self, stats: Mapping[str, Any]) -> Iterator[Metric]:
        """The prefix cache's host tier: occupancy and the bytes moved to and from it."""
        host = stats.get("host_tier") or {}
        for kind, text in (
            ("used", "Host tier bytes holding KV blocks and state snapshots"),
            ("reserved", "Host tier bytes reserved for transfers in flight (part of used)"),
            ("capacity", "Host tier budget (--host-context-mib)"),
            ("peak", "Most host tier bytes used since the server started"),
        ):
            value = (
                0 if kind == "reserved" else host.get(f"{kind}_bytes", 0)
            )  # copies are synchronous
            yield _gauge(f"ninfer_host_context_{kind}_bytes", text, value)
        moved = CounterMetricFamily(
            "ninfer_context_transfer_bytes",
            "Prefix cache payload bytes copied between the device and the host tier",
            labels=["resource", "direction"],
        )
        baseline = self._baseline.get("host_tier") or {}
        since = {key: max(0, int(host.get(key, 0)) - int(baseline.get(key, 0))) for key in host}
        kv_out, kv_in = since.get("block_write_bytes", 0), since.get("block_restore_bytes", 0)
        moved.add_metric(["main_kv", "to_host"], kv_out)
        moved.add_metric(["main_kv", "to_device"], kv_in)
        moved.add_metric(["state", "to_host"], since.get("write_bytes", 0) - kv_out)
        moved.add_metric(["state", "to_device"], since.get("restore_bytes", 0) - kv_in)
        yield moved

    def _worker_time(self, stats: Mapping[str, Any]) -> Iterator[Metric]:
        """The engine worker's wall time: each busy second once, in one host phase or in
        device wait (blocked in a backend forward), whatever the batch size."""
        host = stats.get("host_work_seconds") or {}
        baseline = self._baseline.get("host_work_seconds") or {}
        work = CounterMetricFamily(
            "ninfer_host_work_seconds",
            "Engine worker wall time doing host work, by mutually exclusive phase",
            labels=["phase"],
        )
        for phase in HOST_WORK_PHASES:
            work.add_metric([phase], _seconds_since(host, baseline, phase))
        yield work
        yield _counter(
            "ninfer_device_wait_seconds",
            "Engine worker wall time blocked in backend forwards (not device kernel time)",
            _seconds_since(stats, self._baseline, "device_wait_seconds"),
        )
        yield _counter(
            "ninfer_constraint_draft_wait_seconds",
            "Device wait for speculative drafts in batches with a constrained request, whose "
            "masks wait on them; once per batch, part of ninfer_device_wait_seconds",
            _seconds_since(stats, self._baseline, "constraint_draft_wait_seconds"),
        )

    def _since_start(self, stats: Mapping[str, Any], key: str) -> int:
        return max(0, int(stats.get(key, 0)) - int(self._baseline.get(key, 0)))


class ServerMetrics:
    """The registry behind GET /metrics for one server (tests run several in one process)."""

    def __init__(self, engine: Any, identity: Mapping[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.histograms = RequestHistograms(self.registry)
        self.constraints = ConstraintCounters(self.registry)
        self.response_failures = 0
        self.registry.register(_EngineCollector(engine, identity, self))  # type: ignore[arg-type]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _snapshot(engine: Any) -> Mapping[str, Any]:
    stats = getattr(engine, "stats", None)
    return stats() if callable(stats) else {}


def _seconds_since(now: Mapping[str, Any], baseline: Mapping[str, Any], key: str) -> float:
    return max(0.0, float(now.get(key, 0.0)) - float(baseline.get(key, 0.0)))


def _healthy(engine: Any) -> bool:
    return bool(getattr(engine, "healthy", True))


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=value)
