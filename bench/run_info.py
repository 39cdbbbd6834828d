"""Where and when a benchmark ran, recorded with its figures (never a constant).

`run_info()` gives the UTC date and time, the commit (with a `-dirty` mark when the tree had
uncommitted changes; NINFER_COMMIT names it where the tree has no git metadata, as on a copy
sent to the GPU machine), the CPU, and for CUDA runs the device name, driver and runtime.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> str | None:
    try:
        done = subprocess.run(argv, cwd=_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def commit() -> str:
    named = os.environ.get("NINFER_COMMIT")
    if named:
        return named
    head = _run("git", "rev-parse", "HEAD")
    if head is None:
        return "unknown (no git metadata; set NINFER_COMMIT)"
    dirty = _run("git", "status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cuda_device() -> dict[str, Any]:
    import torch

    index = torch.cuda.current_device()
    driver = _run(
        "nvidia-smi", f"--id={index}", "--query-gpu=driver_version", "--format=csv,noheader"
    )
    return {
        "device": torch.cuda.get_device_name(index),
        "driver": driver or "unknown",
        "cuda_runtime": torch.version.cuda,
    }


def run_info(*, cuda: bool) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC)
    info: dict[str, Any] = {
        "date": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "commit": commit(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
    }
    if cuda:
        info.update(cuda_device())
    return info


def describe(info: dict[str, Any]) -> str:
    """One Markdown line naming the run, for the head of a results file."""
    where = info.get("device") or info["cpu"]
    driver = f", driver {info['driver']}, CUDA {info['cuda_runtime']}" if "driver" in info else ""
    return f"{where}{driver}; {info['date']}; commit {info['commit']}"
