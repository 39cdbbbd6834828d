"""One Qwen3.6-35B-A3B MoE layer's routed experts on the GPU, per expert path.

Backend::moe_experts (routing, the routed experts' gate/up/SwiGLU/down, weighted combine) for
x [tokens, 2048] with 256 experts of width 512, top-8, seeded random bf16 experts made on the
device and random router logits (near-uniform expert loads, as in the random-weight model
benchmark). Paths: "host" (the old one: ids to the host, ~3 cuBLAS calls per used expert),
"grouped" (device plan + two grouped tensor-core GEMM launches; tiles auto, 32/64/128 rows by
128 weight rows, 128 by 256)
and "gemv" (per-pair GEMVs, decode batches). Median device time over --reps runs (CUDA events
around the op), FLOPs = 2 · tokens · top_k · 3 · hidden · ff, and for small batches the floor
of reading the distinct experts' weights once at the measured copy bandwidth.

With --prefill, also the whole Qwen3.6-35B-A3B 8k-token prefill (random device weights, one
lane; floor = FLOPs / measured GEMM rate as in bench_cuda_hybrid.py) and its top kernels.

usage: python3 bench/bench_cuda_moe.py [--tokens 8192,2048,16,1] [--reps 10] [--profile] [--prefill]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ninfer import _core

HIDDEN, FF, EXPERTS, TOP_K = 2048, 512, 256, 8


def expected_distinct_experts(tokens: int) -> float:
    """Expected experts used by `tokens` uniformly routed tokens (top-k without replacement)."""
    return EXPERTS * (1.0 - (1.0 - TOP_K / EXPERTS) ** tokens)


def paths_for(tokens: int) -> list[tuple[str, int, int]]:
    """(path, tile rows, tile columns) to time."""
    paths = [("host", 0, 0), ("grouped", 0, 0), ("grouped", 32, 0), ("grouped", 64, 0),
             ("grouped", 128, 0), ("grouped", 128, 256)]
    if tokens * TOP_K <= 4096:
        paths.append(("gemv", 0, 0))
    return paths


def time_prefill_35b(rate: float, prompt_len: int = 8192) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
    import tempfile
    import time

    import torch
    from model_files import write_bf16_artifact

    from bench_cuda import kernel_breakdown
    from bench_cuda_hybrid import prefill_flops, shape_counts
    from ninfer.convert.qwen3_5_presets import qwen3_5_preset

    cfg = qwen3_5_preset("qwen3.6-35b-a3b")
    counts = shape_counts(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        runner = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=prompt_len,
                                   max_context=prompt_len + 64, device="cuda",
                                   random_weights_seed=1)
    tokens = np.random.default_rng(0).integers(0, counts["vocab"], size=prompt_len).tolist()
    runner.forward(0, 0, tokens[:256])  # warm-up
    runner.reset(0)
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.forward(0, 0, tokens)
        times.append(time.perf_counter() - t0)
        runner.reset(0)
    floor = prefill_flops(counts, prompt_len) / rate
    best = min(times)
    print(f"35B-A3B prefill {prompt_len}: {best:.3f} s ({prompt_len / best:.0f} tok/s), "
          f"floor {floor:.3f} s ({100 * floor / best:.1f}%)", flush=True)
    for name, ms, count in kernel_breakdown(lambda: runner.forward(0, 0, tokens), top=10):
        print(f"  {ms:8.2f} ms  x{count:<5} {name}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="8192,2048,256,64,32,16,4,1")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="per-kernel times (torch.profiler)")
    parser.add_argument("--prefill", action="store_true", help="also the whole 35B-A3B 8k prefill")
    args = parser.parse_args()
    if _core.cuda_device_count() == 0:
        print("no CUDA device")
        return 1
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_cuda import ceilings, kernel_breakdown

    ceil = ceilings()
    bw, rate = ceil["copy_bytes_per_s"], ceil["bf16_gemm_flops"]
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, dense bf16 GEMM {rate / 1e12:.0f} TFLOP/s")
    ops = _core.CudaOps(0)
    rng = np.random.default_rng(20261129)
    expert_bytes = 3 * HIDDEN * FF * 2
    print("| tokens | path | tiles | ms | TFLOP/s | % GEMM rate | weight floor ms | vs host |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = rng.standard_normal((tokens, HIDDEN), dtype=np.float32)
        logits = rng.standard_normal((tokens, EXPERTS), dtype=np.float32)
        flops = 2.0 * tokens * TOP_K * 3 * HIDDEN * FF
        floor_ms = expected_distinct_experts(tokens) * expert_bytes / bw * 1e3
        host_ms = None
        for path, tile_rows, tile_cols in paths_for(tokens):
            ms = ops.time_moe_experts(x, logits, FF, TOP_K, path, tile_rows, tile_cols, args.reps)
            host_ms = ms if path == "host" else host_ms
            tiles = "-" if path != "grouped" else (
                f"{tile_rows}x{tile_cols or 128}" if tile_rows else "auto")
            speedup = f"{host_ms / ms:.1f}x" if host_ms else "-"
            share = 100 * flops / (ms / 1e3) / rate
            print(f"| {tokens} | {path} | {tiles} | {ms:.3f} | {flops / ms / 1e9:.1f} | "
                  f"{share:.1f}% | {floor_ms:.3f} | {speedup} |", flush=True)
        if args.profile and tokens >= 8192:
            for path in ("grouped", "host"):
                def twice(p=path, x=x, logits=logits):
                    ops.time_moe_experts(x, logits, FF, TOP_K, p, 0, 0, 1)

                rows = kernel_breakdown(twice)
                print(f"kernels, {tokens} tokens, {path} (2 runs):")
                for name, ms, count in rows[:7]:
                    print(f"  {ms:8.3f} ms  x{count:<5} {name}")
    if args.prefill:
        del ops
        time_prefill_35b(rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
