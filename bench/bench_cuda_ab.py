"""CUDA A/B benchmark in interleaved rounds (GPU machine): the decode b1 step and/or an 8k
prefill of one Qwen3.6 shape (random weights made on the device) for several configurations —
weight formats and/or the values of one environment switch read when a backend is made
(e.g. NINFER_L2_PREFETCH=0,1) — each round running every configuration once, in order, so that
the machine's drift between runs (±3 % on the H200) falls on all of them alike. Reports the
median of the rounds per configuration and its ratio to the first configuration.

    python3 bench/bench_cuda_ab.py --out DIR [--shape qwen3.6-27b] [--dtypes fp8,nvfp4]
        [--env NINFER_L2_PREFETCH=0,1] [--rounds 3] [--context 1024] [--steps 32]
        [--prefill 8192]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402

from bench_cuda_hybrid import SAMPLING  # noqa: E402


def parse_env(spec: str | None) -> tuple[str | None, list[str | None]]:
    if not spec:
        return None, [None]
    name, _, values = spec.partition("=")
    if not name or not values:
        raise SystemExit(f"--env wants NAME=v1,v2,...: {spec!r}")
    return name, values.split(",")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_config(
    artifact: Path, dtype: str, context: int, steps: int, prefill: int, vocab: int, device: str
) -> dict:
    max_ctx = max(context, prefill) + steps + 64
    runner = _core.ModelRunner(
        str(artifact),
        max_lanes=1,
        max_batch_tokens=max(prefill, 1024) * 2,
        max_context=max_ctx,
        device=device,
        random_weights_seed=1,
        random_weights_dtype=dtype,
    )
    tokens = np.random.default_rng(0).integers(0, vocab, size=max_ctx).tolist()
    out: dict = {}
    if prefill:
        runner.forward(0, 0, tokens[:256])
        runner.reset(0)
        runs = []
        for _ in range(2):  # the second is the reading (the first may time GEMM choices)
            sync()
            t0 = time.perf_counter()
            runner.forward(0, 0, tokens[:prefill])
            runs.append(time.perf_counter() - t0)
            runner.reset(0)
        out["prefill_ms"] = runs[-1] * 1e3
    runner.forward(0, 0, tokens[:context])
    position = context

    def step() -> None:
        nonlocal position
        token = [tokens[position % len(tokens)]]
        if device == "cpu":  # no sampling on the device there
            runner.forward(0, position, token)
        else:
            runner.forward_batch_sampled([(0, position, token)], [SAMPLING | {"uniform": 0.5}])
        position += 1

    for _ in range(4):  # eager, captured, replayed
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    out["step_ms"] = (time.perf_counter() - t0) / steps * 1e3
    return out  # the runner goes with this frame (main collects it before the next one)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="qwen3.6-27b", help="a preset or an HF config.json")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to try the script")
    parser.add_argument("--dtypes", default="fp8,nvfp4")
    parser.add_argument(
        "--env", help="NAME=v1,v2: one switch's values (read when a backend is made)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument(
        "--prefill", type=int, default=0, help="also time a prefill of this many tokens"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env_name, env_values = parse_env(args.env)
    configs = list(itertools.product(args.dtypes.split(","), env_values))
    label = {c: c[0] + (f" {env_name}={c[1]}" if env_name else "") for c in configs}
    shape_file = Path(args.shape)
    cfg = json.loads(shape_file.read_text()) if shape_file.is_file() else qwen3_5_preset(args.shape)
    vocab = cfg.get("text_config", cfg)["vocab_size"]
    readings: dict[tuple, list[dict]] = {c: [] for c in configs}
    saved = os.environ.get(env_name) if env_name else None
    with tempfile.TemporaryDirectory() as tmp:
        artifact = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        for r in range(args.rounds):
            for c in configs:
                if env_name:
                    os.environ[env_name] = c[1]
                got = run_config(
                    artifact, c[0], args.context, args.steps, args.prefill, vocab, args.device
                )
                gc.collect()  # the last runner's device memory, before the next one is made
                readings[c].append(got)
                cells = ", ".join(f"{k} {v:.2f}" for k, v in got.items())
                print(f"[round {r + 1}] {label[c]}: {cells}", flush=True)
    if env_name:
        if saved is None:
            os.environ.pop(env_name, None)
        else:
            os.environ[env_name] = saved
    summary = []
    first = configs[0]
    for c in configs:
        row = {"config": label[c], "dtype": c[0], "env": c[1]}
        for key in readings[c][0]:
            med = statistics.median(x[key] for x in readings[c])
            base = statistics.median(x[key] for x in readings[first])
            row[key] = med
            row[f"{key}_vs_first"] = base / med  # > 1: faster than the first configuration
            row[f"{key}_all"] = [x[key] for x in readings[c]]
        summary.append(row)
    what = f", prefill {args.prefill}" if args.prefill else ""
    lines = [
        f"{args.shape}, {args.rounds} interleaved rounds, decode b1 at {args.context} context "
        f"({args.steps} graph-replayed steps){what}",
        "",
        "| configuration | decode ms / step (median) | tok/s | speed vs first |"
        + (" prefill ms (median) | speed vs first |" if args.prefill else ""),
        "| --- | ---: | ---: | ---: |" + (" ---: | ---: |" if args.prefill else ""),
    ]
    for row in summary:
        line = (
            f"| {row['config']} | {row['step_ms']:.2f} | {1e3 / row['step_ms']:.1f} | "
            f"{row['step_ms_vs_first']:.3f}× |"
        )
        if args.prefill:
            line += f" {row['prefill_ms']:.0f} | {row['prefill_ms_vs_first']:.3f}× |"
        lines.append(line)
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "ab.md").write_text(text)
    record = {"args": vars(args) | {"out": str(args.out)}, "rows": summary}
    (args.out / "ab.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
