"""The fixed-interval throughput record (--log-stats-interval-ms): console and request log.

Each record covers one interval: deltas of the engine's token and round counters plus its
current gauges. An interval in which the engine did nothing and held nothing is omitted, so
an idle server stays quiet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from ninfer.server import console_units as units
from ninfer.server.metrics import HOST_WORK_PHASES
from ninfer.server.telemetry import Telemetry

log = logging.getLogger("ninfer.server")

_DELTAS = (
    "prompt_tokens",
    "prompt_tokens_cached",
    "tokens_prefilled",
    "tokens_decoded",
    "decode_tokens",
    "decode_rounds",
    "decode_rows",
    "steps",
    "requests_admitted",
    "requests_finished",
    "pauses",
    "replay_restores",
    "replayed_tokens",
)


class ThroughputReporter:
    def __init__(self, engine: Any, telemetry: Telemetry, interval_ms: int) -> None:
        self._engine = engine
        self._telemetry = telemetry
        self.interval_s = interval_ms / 1000.0
        self._last = dict(engine.stats())
        self._last_at = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.report()
            except Exception:  # a report must never end the server
                log.exception("throughput report failed")

    def report(self) -> dict[str, Any] | None:
        """One interval's record (logged and written), or None for an idle interval."""
        now = time.perf_counter()
        stats = dict(self._engine.stats())
        deltas = {key: int(stats.get(key, 0)) - int(self._last.get(key, 0)) for key in _DELTAS}
        seconds = now - self._last_at
        previous = self._last
        self._last, self._last_at = stats, now
        running, waiting = int(stats.get("running", 0)), int(stats.get("pending", 0))
        worked = deltas["tokens_prefilled"] or deltas["tokens_decoded"]
        paused = int(stats.get("paused", 0))
        if not worked and not running and not waiting and not paused:
            return None
        record = self._telemetry.base("throughput")
        record.update(
            interval_seconds=seconds,
            deltas=deltas,
            gauges=_gauges(stats),
            scheduling=_deltas(stats, previous, _SCHEDULING),
        )
        hybrid = _hybrid_cache(stats, previous)
        if hybrid is not None:
            record["context_cache"] = {"hybrid": hybrid}
        host_work = _host_work(stats, previous, seconds)
        if host_work is not None:
            record["host_work"] = host_work
        self._telemetry.write(record)
        batch = deltas["decode_rows"] / deltas["decode_rounds"] if deltas["decode_rounds"] else 0
        log.info(
            "throughput: prefill %s, decode %s, batch %.2f, %d running%s, %d waiting%s, "
            "KV %d/%d pages%s",
            units.rate(deltas["tokens_prefilled"] / seconds if seconds > 0 else None),
            units.rate(deltas["tokens_decoded"] / seconds if seconds > 0 else None),
            batch,
            running,
            _composition(stats) if running else "",
            waiting,
            f", {paused} paused" if paused else "",
            int(stats.get("kv_pages_total", 0)) - int(stats.get("kv_pages_free", 0)),
            int(stats.get("kv_pages_total", 0)),
            _host_active(host_work),
        )
        return record


def _host_work(
    stats: Mapping[str, Any], previous: Mapping[str, Any], seconds: float
) -> dict[str, Any] | None:
    """The worker's wall time over the interval: host phases (each segment counted once,
    whatever the batch size) and, separately, device wait. None for an engine that does not
    time its worker."""
    now = stats.get("host_work_seconds")
    if now is None:
        return None
    before = previous.get("host_work_seconds") or {}
    elapsed = {
        phase: max(0.0, float(now.get(phase, 0.0)) - float(before.get(phase, 0.0)))
        for phase in HOST_WORK_PHASES
    }
    elapsed["total"] = sum(elapsed.values())
    device_wait = float(stats.get("device_wait_seconds", 0.0))
    return {
        "elapsed_seconds": elapsed,
        "device_wait_seconds": max(
            0.0, device_wait - float(previous.get("device_wait_seconds", 0.0))
        ),
        "host_active_fraction": elapsed["total"] / seconds if seconds > 0 else None,
    }


def _host_active(host_work: Mapping[str, Any] | None) -> str:
    if host_work is None or host_work["host_active_fraction"] is None:
        return ""
    total = host_work["elapsed_seconds"]["total"]
    return f", host {units.duration(total)} ({host_work['host_active_fraction'] * 100.0:.1f}%)"


def _composition(stats: Mapping[str, Any]) -> str:
    """What the running requests are doing at the end of the interval, e.g. ` (1 prefill,
    2 decode)`; replays are counted among the prefills and named when there are any."""
    parts = [
        f"{int(stats.get('prefilling', 0))} prefill",
        f"{int(stats.get('decode_ready', 0))} decode",
    ]
    if stats.get("replaying"):
        parts.append(f"{int(stats['replaying'])} replaying")
    return f" ({', '.join(parts)})"


def _gauges(stats: Mapping[str, Any]) -> dict[str, Any]:
    keys = (
        "running",
        "pending",
        "prefilling",
        "decode_ready",
        "paused",
        "replaying",
        "kv_pages_total",
        "kv_pages_free",
    )
    return {key: stats[key] for key in keys if key in stats}


_SCHEDULING = {
    "preemptions": ("pauses",),
    "replay_restores": ("replay_restores",),
    "replayed_tokens": ("replayed_tokens",),
}
# context_cache.hybrid interval deltas: record name -> (stats group, key).
_HYBRID_DELTAS = {
    "snapshot_hits": ("prefix_cache", "snapshot_hits"),
    "reused_tokens": ("prefix_cache", "reused_tokens"),
    "blocks_inserted": ("prefix_cache", "blocks_inserted"),
    "blocks_duplicate": ("prefix_cache", "blocks_duplicate"),
    "taps_created": ("prefix_cache", "taps_created"),
    "taps_skipped": ("prefix_cache", "taps_skipped"),
    "endpoints_created": ("prefix_cache", "endpoints_created"),
    "evicted_blocks": ("prefix_cache", "evicted_blocks"),
    "host_image_writes": ("host_tier", "image_writes"),
    "host_block_writes": ("host_tier", "block_writes"),
    "host_image_restores": ("host_tier", "image_restores"),
    "host_block_restores": ("host_tier", "block_restores"),
    "host_write_bytes": ("host_tier", "write_bytes"),
    "host_restore_bytes": ("host_tier", "restore_bytes"),
    "host_snapshot_evictions": ("host_tier", "snapshot_evictions"),
    "host_dead_reclaims": ("host_tier", "dead_reclaims"),
    "unbacked_node_losses": ("host_tier", "unbacked_node_losses"),
}


def _deltas(
    stats: Mapping[str, Any], previous: Mapping[str, Any], names: Mapping[str, tuple[str, ...]]
) -> dict[str, int]:
    def value(source: Mapping[str, Any], path: tuple[str, ...]) -> int:
        for key in path[:-1]:
            source = source.get(key) or {}
        return int(source.get(path[-1], 0))

    return {name: value(stats, path) - value(previous, path) for name, path in names.items()}


def _hybrid_cache(stats: Mapping[str, Any], previous: Mapping[str, Any]) -> dict[str, Any] | None:
    """The prefix cache's gauges and interval counters, once it holds anything."""
    cache, host = stats.get("prefix_cache") or {}, stats.get("host_tier") or {}
    if not cache.get("blocks_inserted") and not cache.get("snapshots"):
        return None
    return {
        "device_blocks": cache.get("blocks", 0),
        "evictable_blocks": cache.get("unreferenced_blocks", 0),
        "tree_blocks": host.get("tree_blocks", cache.get("blocks", 0)),
        "snapshots": cache.get("snapshots", 0) + host.get("snapshots", 0),
        "host_capacity_bytes": host.get("capacity_bytes", 0),
        "host_used_bytes": host.get("used_bytes", 0),
    } | _deltas(stats, previous, _HYBRID_DELTAS)
