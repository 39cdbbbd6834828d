"""Benchmark results name when, where and from which commit they were measured."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import run_info  # noqa: E402


def test_run_info_is_the_real_date_and_commit(monkeypatch):
    monkeypatch.delenv("NINFER_COMMIT", raising=False)
    info = run_info.run_info(cuda=False)
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", info["date"])
    assert info["date"].startswith(today)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True, text=True
    ).stdout.strip()
    assert info["commit"].removesuffix("-dirty") == head
    assert info["cpu"] and info["cpu_count"]
    assert head[:12] in run_info.describe(info)


def test_commit_can_be_named_where_there_is_no_git(monkeypatch):
    monkeypatch.setenv("NINFER_COMMIT", "abc123")
    assert run_info.run_info(cuda=False)["commit"] == "abc123"


def test_cuda_benchmarks_write_no_constant_date():
    for script in ("bench_cuda.py", "bench_cuda_hybrid.py"):
        source = (BENCH / script).read_text()
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", source), script
        assert "run_info(cuda=True)" in source, script
