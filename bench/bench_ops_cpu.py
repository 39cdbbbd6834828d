"""GEMV throughput of the CPU matmul on SmolLM2-135M shapes, against a memory-bandwidth floor.

For every weight dtype and shape it streams enough distinct copies of the weight that they
cannot stay in cache (as in decode, where each layer's weights are read once per token),
and prints the median GB/s of weight bytes read and its ratio to a measured read floor.

Run: PYTHONPATH=python python bench/bench_ops_cpu.py [--threads N] [--kernels NAME]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ninfer import _core
from ninfer.artifact import f32_to_bf16_bits, quantize_q8_0

# (name, out_features n, in_features k) of SmolLM2-135M (hidden 576, 9 q / 3 kv heads of 64).
SHAPES = [
    ("q_proj/o_proj", 576, 576),
    ("k_proj/v_proj", 192, 576),
    ("gate/up_proj", 1536, 576),
    ("down_proj", 576, 1536),
    ("lm_head", 49152, 576),
]
STREAM_BYTES = 256 << 20  # larger than any last-level cache here


def read_bandwidth(threads: int, repeats: int) -> float:
    """Bytes/s of a large multi-threaded read (numpy sums release the GIL)."""
    data = np.ones(STREAM_BYTES // 4, np.float32)
    parts = np.array_split(data, threads)
    with ThreadPoolExecutor(threads) as pool:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.sum, parts))
            times.append(time.perf_counter() - start)
    return data.nbytes / float(np.median(times))


def encode(w: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f32":
        return w
    if dtype == "f16":
        return w.astype(np.float16).view(np.uint16)
    if dtype == "bf16":
        return f32_to_bf16_bits(w)
    return quantize_q8_0(w)


def gemv_rate(n: int, k: int, dtype: str, threads: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    one = encode(rng.standard_normal((n, k)).astype(np.float32), dtype)
    copies = max(2, -(-STREAM_BYTES // one.nbytes))
    weights = [one.copy() for _ in range(copies)]
    x = rng.standard_normal((1, k)).astype(np.float32)
    out = np.empty((1, n), np.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            _core.matmul(x, w, dtype, out, threads=threads)
        times.append((time.perf_counter() - start) / copies)
    return one.nbytes / float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="0 = all cores")
    parser.add_argument("--kernels", default="auto", choices=["auto", "scalar", "avx2", "avxvnni"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="f32,bf16,q8_0")
    args = parser.parse_args()
    _core.set_cpu_kernels(args.kernels)
    threads = args.threads or __import__("os").cpu_count() or 1
    floor = read_bandwidth(threads, args.repeats)
    print(f"kernels={_core.cpu_kernels()} threads={threads}")
    print(f"memory read floor: {floor / 1e9:.2f} GB/s (median of {args.repeats})")
    print(f"{'dtype':6} {'shape':>14} {'name':14} {'GB/s':>8} {'ratio':>6}")
    for dtype in args.dtypes.split(","):
        for name, n, k in SHAPES:
            rate = gemv_rate(n, k, dtype, args.threads, args.repeats)
            print(f"{dtype:6} {f'{n}x{k}':>14} {name:14} {rate / 1e9:8.2f} {rate / floor:6.2f}")


if __name__ == "__main__":
    main()
