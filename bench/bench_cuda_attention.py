"""Prefill attention kernel alone on the Qwen3.6-27B attention shape (CUDA).

24 query heads, 4 KV heads, head_dim 256 (or --shape), causal, one slice. Times the kernel
(default, single- and double-buffered K/V) with CUDA events (median of --reps launches after
a warm-up) and reports TFLOP/s with the causal count 4 * S^2 / 2 * head_dim * heads (a slice
after `start` cached keys counts its rectangle too). torch's scaled_dot_product_attention on
the same shape (bf16, flash and cuDNN backends, K/V expanded to every query head) is the
reference ceiling when torch with CUDA is importable.

    python bench/bench_cuda_attention.py [--tokens 8192 2048] [--chunked] [--reps 20]
        [--shape HEADS KV_HEADS HEAD_DIM] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

from ninfer import _core

QWEN36_27B = (24, 4, 256)  # query heads, KV heads, head_dim
STAGES = [0, 1, 2]  # K/V buffers of the kernel; 0 = the default for the head dim


def causal_flops(start: int, tokens: int, heads: int, head_dim: int) -> float:
    """Q·K^T and P·V over the visible keys: the triangle plus the rectangle of cached keys."""
    pairs = tokens * tokens / 2 + start * tokens
    return 4.0 * pairs * head_dim * heads


def torch_sdpa_ms(
    start: int, tokens: int, shape: tuple[int, int, int], backend_name: str, reps: int
) -> float | None:
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    if not torch.cuda.is_available() or start != 0:
        return None
    backend = getattr(SDPBackend, backend_name)
    gen = torch.Generator(device="cuda").manual_seed(1)
    dims = (1, shape[0], tokens, shape[2])
    q, k, v = (
        torch.randn(dims, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)
    )

    def run() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    try:
        with sdpa_kernel(backend):
            return median_event_ms(torch, run, reps)
    except RuntimeError as err:  # backend not available for this shape/build
        print(f"  torch {backend_name}: unavailable ({str(err).splitlines()[0][:120]})")
        return None


def median_event_ms(torch, run: Callable[[], None], reps: int) -> float:
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 2048])
    parser.add_argument("--chunked", action="store_true", help="also 2048 tokens after 6144 cached")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument(
        "--shape", type=int, nargs=3, default=QWEN36_27B, metavar=("HEADS", "KV_HEADS", "HEAD_DIM")
    )
    parser.add_argument("--json", help="write the results here as well")
    args = parser.parse_args()
    if _core.cuda_device_count() == 0:
        print("no CUDA device (or no CUDA build)", file=sys.stderr)
        return 1
    ops = _core.CudaOps(0)
    cases = [(0, t) for t in args.tokens] + ([(6144, 2048)] if args.chunked else [])
    results = []
    heads, kv_heads, head_dim = args.shape
    for start, tokens in cases:
        flops = causal_flops(start, tokens, heads, head_dim)
        print(
            f"prefill attention, {heads} q heads / {kv_heads} KV heads, head_dim {head_dim}, "
            f"{tokens} tokens after {start}: {flops / 1e9:.1f} GFLOP"
        )
        refs = {}
        for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
            ms = torch_sdpa_ms(start, tokens, tuple(args.shape), name, args.reps)
            if ms is not None:
                refs[name] = ms
                print(f"  torch sdpa {name:16s} {ms:8.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
        best_ref = min(refs.values()) if refs else None
        for stages in STAGES:
            ms = ops.time_prefill_attention(
                start, tokens, heads, kv_heads, head_dim, stages, args.reps
            )
            ratio = f"  {best_ref / ms:5.2f}x of torch's best" if best_ref else ""
            tflops = flops / ms / 1e9
            label = f"K/V stages {stages or 'default'}"
            print(f"  ninfer {label:22s} {ms:8.3f} ms  {tflops:6.1f} TFLOP/s{ratio}")
            results.append(
                {
                    "start": start,
                    "tokens": tokens,
                    "kv_stages": stages,
                    "ms": ms,
                    "tflops": flops / ms / 1e9,
                    "torch_ms": refs,
                }
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
