"""bench/bench_engine_timings.py: its gap summary, and one short run over a tiny header-only
hybrid on the CPU (the sequence and the result file the GPU A/B calls read)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

pytest.importorskip("ninfer._core")
import bench_engine_timings  # noqa: E402
from ninfer.convert.cli import main as convert_main  # noqa: E402
from test_dummy_weights import HYBRID  # noqa: E402


def test_gap_summary_names_the_largest_gaps():
    gaps = [0.015] * 99 + [0.030]  # one two-step gap, after output event 50
    gaps[49], gaps[-1] = 0.030, 0.015
    summary = bench_engine_timings.gap_summary(gaps, top=2)
    assert summary["p50_ms"] == 15.0
    assert summary["largest"][0] == [50, 30.0]
    assert 1.0 <= summary["p99_over_p50"] < 2.0  # p99 of 100 gaps sits below the single outlier
    assert bench_engine_timings.gap_summary([]) == {}


def test_short_run_on_the_cpu(tmp_path, monkeypatch):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(HYBRID))
    artifact = tmp_path / "tiny.ninfer"
    argv = ["--random", str(config), "--header-only", "--name", "tiny", "-o", str(artifact)]
    assert convert_main([*argv, "--tokenizer", "synthetic", "-q"]) == 0
    result = tmp_path / "timings.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "bench_engine_timings.py",
            str(artifact),
            "--device",
            "cpu",
            "--lanes",
            "2",
            "--prefill-chunk",
            "64",
            "--max-context",
            "256",
            "--probe-lens",
            "100:1",
            "--long-lens",
            "32:24",
            "--gc-freeze",
            "--result-file",
            str(result),
        ],
    )
    assert bench_engine_timings.main() == 0
    runs = json.loads(result.read_text())["runs"]
    assert [r["label"] for r in runs] == ["probe 100 #1", "long 32 out 24"]
    assert runs[0]["prompt"] == 100 and runs[0]["prompt_ms"] > 0
    assert runs[1]["decode_ms_per_token"] > 0 and runs[1]["gaps"]["p50_ms"] >= 0
