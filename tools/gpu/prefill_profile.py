"""Where an 8k prefill of the Qwen3.6-27B shape spends its device time, per kernel (GPU machine).

Random weights in --dtype (fp8: the dense matmuls through the FP8 GEMM unless NINFER_FP8_GEMM=0),
one warm-up prefill, then one under torch.profiler (CUPTI sees every kernel of the process, ours
and cuBLAS's). Prints the kernels by total time and a sum per kind (GEMM, FP8 quantizer, delta
rule, attention, norms and elementwise, other); writes OUT/profile_<dtype>.json.

usage: python tools/gpu/prefill_profile.py --out DIR [--dtype fp8] [--tokens 8192]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_files import write_bf16_artifact  # noqa: E402

# (kind, substrings of the kernel name), first match wins
KINDS = [
    ("fp8 quantize", ("quantize_fp8", "requantize")),
    ("dequantize", ("dequantize",)),
    ("delta rule", ("delta", "gdn", "chunk", "conv1d", "linear_attn", "recurrent", "l2norm")),
    ("attention", ("attention", "attn", "flash", "softmax", "rope", "kv_write")),
    ("gemm", ("gemm", "xmma", "cutlass", "sm90", "cublas", "matmul", "gemv", "mma")),
    (
        "norm / elementwise",
        ("norm", "silu", "swiglu", "add", "mul", "gate", "bf16", "f32", "copy", "convert", "scale"),
    ),
]


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="fp8")
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    cfg = qwen3_5_preset("qwen3.6-27b")
    text = cfg.get("text_config", cfg)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        runner = _core.ModelRunner(
            str(path),
            max_lanes=1,
            max_batch_tokens=args.tokens,
            max_context=args.tokens + 64,
            device="cuda",
            random_weights_seed=1,
            random_weights_dtype=args.dtype,
        )
    tokens = np.random.default_rng(0).integers(0, text["vocab_size"], size=args.tokens).tolist()
    runner.forward(0, 0, tokens)
    runner.reset(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        runner.forward(0, 0, tokens)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e3)
    rows = sorted(((sum(v), len(v), n) for n, v in kernels.items()), reverse=True)
    total = sum(r[0] for r in rows)
    kinds: dict[str, float] = {}
    for ms, _, name in rows:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    print(
        f"27B {args.dtype} prefill {args.tokens}: wall {wall * 1e3:.0f} ms, kernels {total:.0f} ms"
    )
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:20s} {ms:8.1f} ms  {100 * ms / total:5.1f} %")
    for ms, count, name in rows[:25]:
        print(f"  {ms:8.2f} ms  x{count:<4d} [{kind_of(name)}] {name[:110]}")
    (args.out / f"profile_{args.dtype}.json").write_text(
        json.dumps(
            {
                "wall_ms": wall * 1e3,
                "kernel_ms": total,
                "kinds": kinds,
                "kernels": [{"name": n, "ms": ms, "count": c} for ms, c, n in rows[:60]],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
