"""Where an 8k prefill of the Qwen3.6-27B shape spends its device time, per kernel (GPU machine).

Random weights in --dtype (fp8: the dense matmuls through the FP8 GEMM unless NINFER_FP8_GEMM=0),
one warm-up prefill, then one under torch.profiler (CUPTI sees every kernel of the process, ours
and cuBLAS's). Prints the kernels by total time and a sum per kind (GEMM, FP8 quantizer, delta
rule, attention, norms and elementwise, other); then where the device sat idle inside the
prefill: the union of device activity against the span from the first to the last of it, the
idle gaps summed by the (kernel before, kernel after) pair that frames them, and the CUDA runtime
calls the host made (counts and host time: a synchronize or an allocation inside the prefill is
what leaves the device waiting for the host's next launches). Writes OUT/profile_<dtype>.json.

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


def short(name: str) -> str:
    return name.split("(")[0].split("<")[0][-60:]


def idle_gaps(prof) -> dict:
    """Idle time between device activities (kernels, copies, sets) of the profiled prefill,
    summed by the pair of activities around each gap, and the CUDA runtime calls of the host."""
    device = torch.autograd.DeviceType.CUDA
    spans = sorted(
        (e.time_range.start, e.time_range.end, short(e.name))
        for e in prof.events()
        if e.device_type == device
    )
    pairs: dict[tuple[str, str], list[float]] = {}
    busy = idle = 0.0
    gaps = 0
    done, last = spans[0][0], spans[0][2]
    for start, end, name in spans:
        if start - done >= 2:  # us
            gaps += 1
            idle += start - done
            slot = pairs.setdefault((last, name), [0.0, 0])
            slot[0] += start - done
            slot[1] += 1
        busy += max(0.0, end - max(start, done))
        if end > done:
            done, last = end, name
    runtime: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type != device and e.name.startswith("cuda"):
            slot = runtime.setdefault(e.name, [0.0, 0])
            slot[0] += e.time_range.elapsed_us()
            slot[1] += 1
    return {
        "span_ms": (done - spans[0][0]) / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": idle / 1e3,
        "gaps": gaps,
        "pairs": [
            {"before": b, "after": a, "ms": v[0] / 1e3, "count": v[1]}
            for (b, a), v in sorted(pairs.items(), key=lambda kv: -kv[1][0])[:40]
        ],
        "runtime": [
            {"name": n, "ms": v[0] / 1e3, "count": v[1]}
            for n, v in sorted(runtime.items(), key=lambda kv: -kv[1][0])
        ],
    }


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
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
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
    idle = idle_gaps(prof)
    print(
        f"  device span {idle['span_ms']:.1f} ms, busy {idle['busy_ms']:.1f} ms, "
        f"idle {idle['idle_ms']:.1f} ms in {idle['gaps']} gaps (>= 2 us)"
    )
    for pair in idle["pairs"][:12]:
        where = f"{pair['before']} -> {pair['after']}"
        print(f"    idle {pair['ms']:7.2f} ms x{pair['count']:<4d} {where}")
    for call in idle["runtime"][:12]:
        print(f"    host {call['ms']:7.2f} ms x{call['count']:<5d} {call['name']}")
    (args.out / f"profile_{args.dtype}.json").write_text(
        json.dumps(
            {
                "wall_ms": wall * 1e3,
                "kernel_ms": total,
                "kinds": kinds,
                "kernels": [{"name": n, "ms": ms, "count": c} for ms, c, n in rows[:60]],
                "idle": idle,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
