"""CUDA decode with each --kv-dtype on the Qwen3.6-27B shape (random bf16 weights).

In one process, the copy bandwidth first (bench_cuda.py's ceiling), then per KV format
(bf16, fp8, int8, nvfp4): decode tokens/s at batch 1/8/16 with 8k and 32k context under
decode CUDA graphs, each against its floor (the bytes a step reads: the weights, the KV
cache of the 16 full-attention layers in the format's page bytes, the GDN states read and
written, divided by the copy rate), and the decode-attention kernels alone (device time of
decode_attention + combine_splits in one eager step, from the profiler) against the KV bytes
they read. Contexts are assumed, not prefilled (ModelRunner.assume_context): every lane's
pages are taken and read in full, their contents are zeros, which costs the kernels the same.

Writes results_kv.json / results_kv.md under --out (after every format) and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402

from bench_cuda import copy_bandwidth, kernel_breakdown  # noqa: E402
from bench_cuda_hybrid import SAMPLING, shape_counts  # noqa: E402
from run_info import describe, run_info  # noqa: E402

ATTENTION_KERNELS = ("decode_attention", "combine_splits")


def kv_bytes_per_token(counts: dict, kv_dtype: str) -> float:
    """Bytes one token's K and V take in the format (all attention layers, all KV heads)."""
    layers, hd = counts["attn_layers"], counts["head_dim"]
    kv_heads = round(counts["kv_bytes_per_token"] / (layers * 2 * hd * 2))  # from bf16 bytes
    return _core.kv_page_bytes(kv_dtype, layers, kv_heads, hd, 2) / 64


def run_format(path: Path, cfg: dict, kv_dtype: str, bw: float, args) -> dict:
    counts = shape_counts(cfg)
    per_token = kv_bytes_per_token(counts, kv_dtype)
    lanes, contexts, batches = max(args.batches), args.contexts, args.batches
    t0 = time.perf_counter()
    runner = _core.ModelRunner(
        str(path),
        max_lanes=lanes,
        max_batch_tokens=64,
        max_context=max(contexts) + args.steps + 64,
        device="cuda",
        random_weights_seed=1,
        kv_dtype=kv_dtype,
        snapshot_slots=1,
    )
    out: dict = {"kv_dtype": kv_dtype, "kv_bytes_per_token": per_token, "rows": [], "kernels": []}
    out["load_s"] = time.perf_counter() - t0
    os.environ["NINFER_CUDA_GRAPHS"] = "1"
    for context in contexts:
        for lane in range(lanes):
            runner.assume_context(lane, context)
        position = [context] * lanes
        for batch in batches:

            def step(batch=batch, position=position):
                runner.forward_batch_sampled(
                    [(lane, position[lane], [lane + 1]) for lane in range(batch)],
                    [SAMPLING | {"uniform": (lane + 0.5) / batch} for lane in range(batch)],
                )
                for lane in range(batch):
                    position[lane] += 1

            for _ in range(3):  # capture, then warm replays
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            sec = (time.perf_counter() - t0) / args.steps
            c = shape_counts(cfg, batch)
            kv = batch * (position[0] - args.steps / 2) * per_token
            state = batch * 2 * c["state_bytes_per_lane"]
            floor = (2.0 * c["read_params"] + kv + state) / bw
            row = {
                "context": context,
                "batch": batch,
                "step_ms": sec * 1e3,
                "tokens_per_s": batch / sec,
                "floor_tokens_per_s": batch / floor,
                "ratio": floor / sec,
                "kv_gb": kv / 1e9,
                "weight_gb": 2.0 * c["read_params"] / 1e9,
            }
            out["rows"].append(row)
            print(
                f"[{kv_dtype}] ctx {context} b{batch}: {row['tokens_per_s']:.1f} tok/s "
                f"({row['step_ms']:.2f} ms), floor {row['floor_tokens_per_s']:.1f} "
                f"({100 * row['ratio']:.1f}%), KV {row['kv_gb']:.2f} GB",
                flush=True,
            )
        for batch in (1, lanes):  # the attention kernels alone, one eager step
            os.environ["NINFER_CUDA_GRAPHS"] = "0"
            pos = position[0]
            rows = kernel_breakdown(
                lambda b=batch, p=pos: runner.forward_batch_sampled(
                    [(lane, p, [lane + 1]) for lane in range(b)],
                    [SAMPLING | {"uniform": 0.5} for _ in range(b)],
                ),
                top=60,
            )
            for lane in range(batch):
                position[lane] = pos + 1
            for lane in range(batch, lanes):
                runner.assume_context(lane, pos + 1)
                position[lane] = pos + 1
            os.environ["NINFER_CUDA_GRAPHS"] = "1"
            ms = sum(t for name, t, _ in rows if any(k in name for k in ATTENTION_KERNELS))
            kv = batch * pos * per_token
            kernel = {
                "context": context,
                "batch": batch,
                "attention_ms": ms,
                "kv_gb": kv / 1e9,
                "floor_ms": kv / bw * 1e3,
                "ratio": (kv / bw * 1e3) / ms if ms else 0.0,
            }
            out["kernels"].append(kernel)
            print(
                f"[{kv_dtype}] ctx {context} b{batch} decode attention: {ms:.3f} ms per step "
                f"(16 layers), floor {kernel['floor_ms']:.3f} ms ({100 * kernel['ratio']:.1f}%)",
                flush=True,
            )
    os.environ.pop("NINFER_CUDA_GRAPHS", None)
    runner = None  # frees the weights and the pool before the next format
    gc.collect()
    return out


def to_markdown(result: dict) -> str:
    bw = result["copy_bytes_per_s"]
    lines = [
        f"Run: {describe(result)}.",
        "",
        f"Ceiling (same run): copy {bw / 1e12:.2f} TB/s. Qwen3.6-27B shape, random bf16 weights, "
        "decode CUDA graphs, contexts assumed (pages read in full).",
        "",
        "| KV | context | batch | tok/s | ms/step | floor tok/s | ratio | KV GB/step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in result["formats"]:
        for r in f["rows"]:
            lines.append(
                f"| {f['kv_dtype']} | {r['context']} | {r['batch']} | {r['tokens_per_s']:.1f} "
                f"| {r['step_ms']:.2f} | {r['floor_tokens_per_s']:.1f} | {100 * r['ratio']:.1f}% "
                f"| {r['kv_gb']:.2f} |"
            )
    lines += [
        "",
        "Decode attention alone (decode_attention + combine_splits, 16 layers, one eager step):",
        "",
        "| KV | context | batch | ms | KV GB | floor ms | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in result["formats"]:
        for k in f["kernels"]:
            lines.append(
                f"| {f['kv_dtype']} | {k['context']} | {k['batch']} | {k['attention_ms']:.3f} "
                f"| {k['kv_gb']:.2f} | {k['floor_ms']:.3f} | {100 * k['ratio']:.1f}% |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--formats", default="bf16,fp8,int8,nvfp4")
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--contexts", default="8192,32768")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {**run_info(cuda=True), "copy_bytes_per_s": copy_bandwidth(), "formats": []}
    torch.cuda.empty_cache()
    print(f"copy {result['copy_bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    cfg = qwen3_5_preset("qwen3.6-27b")
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        for kv_dtype in args.formats.split(","):
            try:
                result["formats"].append(
                    run_format(path, cfg, kv_dtype, result["copy_bytes_per_s"], args)
                )
            except Exception as exc:  # keep the other formats' figures
                print(f"[{kv_dtype}] FAILED: {type(exc).__name__}: {exc}", flush=True)
                result.setdefault("failures", []).append(f"{kv_dtype}: {exc}")
                status = 1
            (args.out / "results_kv.json").write_text(json.dumps(result, indent=2))
            (args.out / "results_kv.md").write_text(to_markdown(result) + "\n")
    print(to_markdown(result))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
