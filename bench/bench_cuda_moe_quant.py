"""Qwen3.6-35B-A3B with bf16 / FP8 / NVFP4 weights on the GPU: decode and prefill against
their floors, and where a batch-1 decode step's time goes.

In one process, ceilings first (bench_cuda.py's copy bandwidth and bf16 GEMM rate), then per
format (seeded random weights made on the device in the artifact's layout; experts stay in
their stored format):
- prefill 8192 tokens, one lane: floor = FLOPs ÷ rate, the dense matmuls at the GEMM rate of
  the path they take (FP8 weights: the FP8 block GEMM's, measured here), the rest at bf16's
  (quantized expert stacks are dequantized per layer for the bf16 grouped GEMMs);
- decode b1/4/8/16 at 1k and 8k context with CUDA graphs and device sampling: floor = the
  bytes a step reads, weights in their stored format (the experts only for the expected
  distinct experts of `batch` tokens under uniform routing: E·(1 − (1 − k/E)^batch)) + KV +
  GDN state read and written, ÷ the copy rate; per KV format of --kv-dtypes (its page
  bytes in the floor);
- batch 1 at 1k with the fused MoE kernels off (NINFER_MOE_FUSED=0: the separate ops);
- graph-replayed batch-1 steps at 1k on the critical path (replay_breakdown: what each kernel
  adds to the step, overlapped launches counted once, and the idle gaps);
- the kernels of one eager batch-1 step (torch profiler).

Writes results_moe_quant.json / .md under --out and prints the tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ninfer import _core
from ninfer.artifact.layout import tensor_nbytes
from ninfer.convert.qwen3_5_presets import qwen3_5_preset
from ninfer.convert.random import plan_random_artifact

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402

from bench_cuda import ceilings, kernel_breakdown, profile_replays, replay_markdown  # noqa: E402
from bench_cuda_fp8_prefill import floor_seconds, fp8_gemm_rate  # noqa: E402
from bench_cuda_hybrid import SAMPLING, prefill_lanes, shape_counts  # noqa: E402
from bench_cuda_kv import kv_bytes_per_token  # noqa: E402
from bench_cuda_quant import prefill_format  # noqa: E402

SHAPE = "qwen3.6-35b-a3b"


def step_weight_bytes(cfg: dict, dtype: str, batch: int) -> float:
    """Weight bytes one decode step of `batch` tokens reads, each tensor in its stored format;
    expert stacks only for the expected distinct experts."""
    plan = plan_random_artifact(cfg, dtype=dtype)
    c = plan.config
    e, k = c.get("num_experts", 0) or 0, c.get("num_experts_per_tok", 0) or 0
    distinct = e * (1 - (1 - k / e) ** batch) if e else 0
    total = 0.0
    for name, (stored, shape) in plan.tensors.items():
        if name.startswith("mtp.") or name == "model.embed_tokens.weight":
            continue
        nbytes = tensor_nbytes(stored, shape)
        total += nbytes * distinct / e if ".mlp.experts." in name else nbytes
    return total


def decode_rate(runner, tokens, position, batch: int, steps: int) -> float:
    def step():
        runner.forward_batch_sampled(
            [(lane, position[lane], [tokens[lane]]) for lane in range(batch)],
            [SAMPLING | {"uniform": (lane + 0.5) / batch} for lane in range(batch)],
        )
        for lane in range(batch):
            position[lane] += 1

    for _ in range(3):  # eager, captured, replayed
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def run_format(cfg, dtype, kv_dtype, bw, rates, steps, contexts, batches) -> dict:
    counts = shape_counts(cfg)
    kv_per_token = kv_bytes_per_token(counts, kv_dtype)
    lanes = max(batches)
    out: dict = {"dtype": dtype, "kv_dtype": kv_dtype, "kv_bytes_per_token": kv_per_token}
    tag = f"{dtype} kv {kv_dtype}"
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        t0 = time.perf_counter()
        runner = _core.ModelRunner(
            str(path),
            max_lanes=lanes,
            max_batch_tokens=16384,
            # the 8192-token prefill runs in lane 0 too, whatever the decode contexts
            max_context=max(*contexts, 8192) + 8 * (steps + 4) + 64,
            device="cuda",
            random_weights_seed=1,
            random_weights_dtype=dtype,
            kv_dtype=kv_dtype,
        )
        out["load_s"] = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, counts["vocab"], size=max(*contexts, 8192) + 8).tolist()
    runner.forward(0, 0, tokens[:256])
    runner.reset(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    runner.forward(0, 0, tokens[:8192])
    seconds = time.perf_counter() - t0
    runner.reset(0)
    fmt = prefill_format(dtype)
    floor = floor_seconds(cfg, rates, fmt)
    out["prefill"] = {
        "seconds": seconds,
        "tokens_per_s": 8192 / seconds,
        "ratio": floor / seconds,
        "floor_tokens_per_s": 8192 / floor,
        "floor_rate": fmt,
    }
    print(
        f"[{tag}] prefill 8192: {8192 / seconds:.0f} tok/s ({100 * floor / seconds:.1f}% of "
        f"the {fmt}-GEMM floor)",
        flush=True,
    )
    rows = []
    position = [0] * lanes
    for context in contexts:
        prefill_lanes(runner, tokens, context, lanes)
        position = [context] * lanes
        for batch in batches:
            sec = decode_rate(runner, tokens, position, batch, steps)
            c = shape_counts(cfg, batch)
            weights = step_weight_bytes(cfg, dtype, batch)
            kv = batch * (position[0] - steps / 2) * kv_per_token
            state = batch * 2 * c["state_bytes_per_lane"]
            floor_step = (weights + kv + state) / bw
            row = {
                "context": context,
                "batch": batch,
                "step_ms": sec * 1e3,
                "tokens_per_s": batch / sec,
                "floor_ms": floor_step * 1e3,
                "floor_tokens_per_s": batch / floor_step,
                "ratio": floor_step / sec,
                "weight_gb": weights / 1e9,
            }
            rows.append(row)
            print(
                f"[{tag}] decode ctx {context} b{batch}: {row['tokens_per_s']:.1f} tok/s "
                f"({row['step_ms']:.2f} ms), floor {row['floor_ms']:.2f} ms "
                f"({100 * row['ratio']:.1f}%), {row['weight_gb']:.2f} GB of weights",
                flush=True,
            )
        if context == contexts[0]:
            pos1 = position[0]

            def replayed_b1():
                nonlocal pos1
                runner.forward_batch_sampled(
                    [(0, pos1, [tokens[3]])], [SAMPLING | {"uniform": 0.5}]
                )
                pos1 += 1

            replayed_b1()  # the b1 graph exists (decode_rate): this one replays it
            rb = profile_replays(replayed_b1, tag)
            if rb:
                out["replay_b1"] = rb
            position[0] = pos1
            os.environ["NINFER_MOE_FUSED"] = "0"
            sec = decode_rate(runner, tokens, position, 1, steps)
            os.environ.pop("NINFER_MOE_FUSED")
            out["unfused_b1_ms"] = sec * 1e3
            print(f"[{tag}] decode ctx {context} b1, fused MoE off: {sec * 1e3:.2f} ms", flush=True)
    out["decode"] = rows
    os.environ["NINFER_CUDA_GRAPHS"] = "0"
    pos = position[0]
    out["breakdown_b1"] = kernel_breakdown(
        lambda: runner.forward_batch_sampled(
            [(0, pos, [tokens[2]])], [SAMPLING | {"uniform": 0.5}]
        ),
        top=16,
    )
    os.environ.pop("NINFER_CUDA_GRAPHS")
    return out


def to_markdown(result: dict) -> str:
    bw, rate = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["bf16_gemm_flops"]
    lines = [
        f"Ceilings (same run): copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s.",
        "",
    ]
    for f in result["formats"]:
        p = f["prefill"]
        lines += [
            f"### {SHAPE} {f['dtype']}, KV {f.get('kv_dtype', 'bf16')}",
            "",
            "| what | measured | floor | ratio |",
            "| --- | --- | --- | --- |",
            f"| prefill 8192 | {p['tokens_per_s']:.0f} tok/s ({p['seconds']:.3f} s) | "
            f"{p['floor_tokens_per_s']:.0f} tok/s ({p.get('floor_rate', 'bf16')} GEMM) | "
            f"{100 * p['ratio']:.1f}% |",
        ]
        for r in f["decode"]:
            lines.append(
                f"| decode b{r['batch']} {r['context']} | {r['tokens_per_s']:.1f} tok/s "
                f"({r['step_ms']:.2f} ms) | {r['floor_ms']:.2f} ms ({r['weight_gb']:.2f} GB "
                f"weights) | {100 * r['ratio']:.1f}% |"
            )
        if "unfused_b1_ms" in f:
            lines.append(f"| decode b1, fused MoE off | {f['unfused_b1_ms']:.2f} ms | | |")
        if "replay_b1" in f:
            lines += replay_markdown(f["replay_b1"])
        lines += ["", "b1 step kernels (eager; name, ms, launches):"]
        lines += [f"- {n}: {ms:.3f} ms x {cnt}" for n, ms, cnt in f["breakdown_b1"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtypes", default="fp8,bf16,nvfp4")
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--kv-dtypes", default="bf16", help="KV cache formats, e.g. bf16,fp8")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = qwen3_5_preset(SHAPE)
    result: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0),
        "ceilings": ceilings(),
        "formats": [],
    }
    bw, rate = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["bf16_gemm_flops"]
    rates = {"bf16": rate, "fp8": fp8_gemm_rate()}
    result["ceilings"]["fp8_gemm_flops"] = rates["fp8"]
    print(
        f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s, FP8 block "
        f"GEMM {rates['fp8'] / 1e12 if rates['fp8'] else float('nan'):.0f} TFLOP/s",
        flush=True,
    )
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    status = 0
    runs = [(d, kv) for d in args.dtypes.split(",") for kv in args.kv_dtypes.split(",")]
    for dtype, kv_dtype in runs:
        try:
            result["formats"].append(
                run_format(cfg, dtype, kv_dtype, bw, rates, args.steps, contexts, batches)
            )
        except Exception as exc:  # keep the other formats' figures
            print(f"[{dtype} kv {kv_dtype}] FAILED: {type(exc).__name__}: {exc}", flush=True)
            result.setdefault("failures", []).append(f"{dtype} kv {kv_dtype}: {exc}")
            status = 1
        (args.out / "results_moe_quant.json").write_text(json.dumps(result, indent=2))
        (args.out / "results_moe_quant.md").write_text(to_markdown(result))
        torch.cuda.empty_cache()
    print(to_markdown(result))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
