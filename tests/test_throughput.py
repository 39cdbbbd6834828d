"""The fixed-interval throughput record: deltas over the interval, idle intervals omitted."""

from __future__ import annotations

import logging

from ninfer.server.telemetry import Telemetry
from ninfer.server.throughput import ThroughputReporter


class Engine:
    def __init__(self) -> None:
        self.values = {"tokens_prefilled": 0, "tokens_decoded": 0, "decode_rows": 0,
                       "decode_rounds": 0, "running": 0, "pending": 0,
                       "kv_pages_total": 64, "kv_pages_free": 64}  # fmt: skip

    def stats(self) -> dict[str, int]:
        return dict(self.values)


class Log:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def write(self, record: dict) -> None:
        self.records.append(record)


def test_idle_intervals_are_omitted_and_busy_ones_report_deltas(caplog):
    engine, request_log = Engine(), Log()
    reporter = ThroughputReporter(engine, Telemetry(request_log=request_log), 5000)
    with caplog.at_level(logging.INFO):
        assert reporter.report() is None  # nothing happened, nothing held
        engine.values.update(tokens_prefilled=300, tokens_decoded=40, decode_rows=60,
                             decode_rounds=30, running=2, kv_pages_free=60)  # fmt: skip
        record = reporter.report()
        assert record is not None and request_log.records == [record]
        assert record["event"] == "throughput"
        assert record["deltas"]["tokens_prefilled"] == 300
        assert record["gauges"]["running"] == 2
        engine.values.update(tokens_decoded=50)
        assert reporter.report()["deltas"]["tokens_decoded"] == 10  # since the last record
        engine.values.update(running=0)
        assert reporter.report() is None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("throughput")]
    assert len(lines) == 2
    assert "batch 2.00" in lines[0] and "2 running" in lines[0] and "KV 4/64 pages" in lines[0]


def test_zero_interval_never_starts():
    reporter = ThroughputReporter(Engine(), Telemetry(), 0)
    reporter.start()  # no loop needed: nothing is scheduled
    reporter.stop()


def test_worker_time_deltas_per_interval(caplog):
    engine, request_log = Engine(), Log()
    phases = ("engine_boundary", "program_submit", "program_post", "engine_commit_output",
              "engine_maintenance")  # fmt: skip
    engine.values["host_work_seconds"] = dict.fromkeys(phases, 1.0)
    engine.values["device_wait_seconds"] = 2.0
    reporter = ThroughputReporter(engine, Telemetry(request_log=request_log), 5000)
    engine.values.update(tokens_decoded=10, running=1)
    engine.values["host_work_seconds"] = {**dict.fromkeys(phases, 1.0), "program_submit": 1.25,
                                          "engine_commit_output": 1.5}  # fmt: skip
    engine.values["device_wait_seconds"] = 3.0
    with caplog.at_level(logging.INFO):
        work = reporter.report()["host_work"]
    assert work["elapsed_seconds"]["program_submit"] == 0.25
    assert work["elapsed_seconds"]["engine_commit_output"] == 0.5
    assert work["elapsed_seconds"]["engine_boundary"] == 0.0
    assert work["elapsed_seconds"]["total"] == 0.75
    assert work["device_wait_seconds"] == 1.0
    assert work["host_active_fraction"] > 0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("throughput"))
    assert ", host 750 ms (" in line
