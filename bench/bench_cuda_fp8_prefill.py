"""FP8 and NVFP4 prefill on the GPU machine: the block-scaled FP8 GEMM against bf16, alone and
end to end.

In one process:
1. rates: bf16 cuBLAS GEMM 8192³ (torch) and the FP8 block-scaled GEMM 8192³ (ours, x already
   quantized): the ceilings of the two formats;
2. each matmul of a Qwen3.6-27B prefill chunk of 8192 tokens, alone, by path: bf16 weights
   (bf16 GEMM), FP8 weights through today's fallback (dequantize to bf16 + bf16 GEMM) and
   through the FP8 GEMM (quantize x + GEMM), NVFP4 through both, as TFLOP/s against the
   format's rate;
3. prefill of 8192 tokens end to end (the second of two runs; the first grows the scratch) on
   the 27B and 35B-A3B shapes (random weights made on the device) for bf16, fp8 (FP8 GEMM, and
   NINFER_FP8_FUSED=0 for the quantizer run apart from the SwiGLU and the gated norm, and
   NINFER_FP8_GEMM=0 for the old path on the same weights), nvfp4 (bf16 path, and
   NINFER_NVFP4_PREFILL=fp8); floor = FLOPs ÷ rate, the quantized dense matmuls at the
   format's GEMM rate, everything else (MoE experts, which run bf16, attention, the delta
   rule) at the bf16 rate; ratio to bf16's prefill time.

Stops starting new model runs past --budget-s. Writes results_fp8_prefill.json/.md to --out.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
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

from bench_cuda import gemm_rate  # noqa: E402
from bench_cuda_hybrid import prefill_flops, shape_counts  # noqa: E402

TOKENS = 8192
# (name, rows, k) of the matmuls of one 27B layer kind
SHAPES_27B = [
    ("gdn in_proj qkv", 10240, 5120),
    ("gdn in_proj z", 6144, 5120),
    ("gdn out_proj = attn o_proj", 5120, 6144),
    ("attn q+gate", 12288, 5120),
    ("attn k", 1024, 5120),
    ("mlp gate", 17408, 5120),
    ("mlp down", 5120, 17408),
]
GEMM_PATHS = ["bf16", "fp8-bf16", "fp8", "fp8-gemm", "nvfp4-bf16", "nvfp4-fp8"]


def median(values: list[float]) -> float:
    return float(np.median(values))


def timed_ms(kernels, path: str, n: int, k: int, m: int, reps: int) -> float | None:
    """Median device time, or None (and the reason printed) when the path refuses the shape."""
    try:
        return median(kernels.time(path, n, k, m, reps))
    except RuntimeError as exc:
        print(f"{path} [{m} x {n} x {k}] not timed: {exc}", flush=True)
        return None


def fp8_gemm_rate(kernels=None) -> float | None:
    """FLOP/s of the FP8 block-scaled GEMM at 8192³ (x already quantized): the ceiling of FP8
    weights' prefill matmuls; None when cuBLASLt refuses it here."""
    kernels = kernels or _core.CudaFp8Gemm(0)
    ms = timed_ms(kernels, "fp8-gemm", 8192, 8192, 8192, 10)
    return 2.0 * 8192**3 / (ms * 1e-3) if ms else None


def gemm_table(kernels) -> list[dict]:
    rows = []
    for name, n, k in SHAPES_27B:
        flops = 2.0 * TOKENS * n * k
        row = {"name": name, "rows": n, "k": k}
        for path in GEMM_PATHS:
            ms = timed_ms(kernels, path, n, k, TOKENS, 5)
            row[path] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12 if ms else None}
        rows.append(row)
        print(
            f"{name:16s} [{n} x {k}] " + " ".join(cell(row[p], p) for p in GEMM_PATHS), flush=True
        )
    return rows


def cell(entry: dict, label: str = "") -> str:
    if entry["ms"] is None:
        return f"{label} –".strip()
    return f"{label} {entry['ms']:.3f} ms ({entry['tflops']:.0f})".strip()


def floor_seconds(cfg: dict, rates: dict, fmt: str) -> float:
    """FLOPs ÷ rate: the dense matmuls (lm_head but one row excluded) at the format's rate,
    the rest (MoE experts run bf16, attention, delta rule, one lm_head row) at bf16's."""
    counts = shape_counts(cfg)
    total = prefill_flops(counts, TOKENS)
    text = cfg.get("text_config", cfg)
    dense = 2.0 * TOKENS * (counts["dense_params"] - text["vocab_size"] * text["hidden_size"])
    fast = rates["fp8"] if fmt == "fp8" else rates["bf16"]
    if fast is None:  # the FP8 GEMM was refused: no FP8 floor
        return float("nan")
    return dense / fast + (total - dense) / rates["bf16"]


def prefill_seconds(runner, tokens: list[int]) -> tuple[float, float]:
    """(first, second) run of the whole prompt: the first grows the scratch and makes the
    GEMM plans of the shape, the second is the steady state reported."""
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.forward(0, 0, tokens[:TOKENS])
        times.append(time.perf_counter() - t0)
        runner.reset(0)
    return times[0], times[1]


def run_shape(name: str, dtype: str, rates: dict) -> list[dict]:
    cfg = qwen3_5_preset(name)
    text = cfg.get("text_config", cfg)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        t0 = time.perf_counter()
        runner = _core.ModelRunner(
            str(path),
            max_lanes=1,
            max_batch_tokens=TOKENS,
            max_context=TOKENS + 64,
            device="cuda",
            random_weights_seed=1,
            random_weights_dtype=dtype,
        )
        load = time.perf_counter() - t0
    tokens = np.random.default_rng(0).integers(0, text["vocab_size"], size=TOKENS).tolist()
    variants = {
        "bf16": [("bf16", {}, "bf16")],
        "fp8": [
            ("fp8 (FP8 GEMM)", {"NINFER_FP8_GEMM": "1", "NINFER_FP8_FUSED": "1"}, "fp8"),
            (
                "fp8 (FP8 GEMM, producers unfused)",
                {"NINFER_FP8_GEMM": "1", "NINFER_FP8_FUSED": "0"},
                "fp8",
            ),
            ("fp8 (bf16 fallback)", {"NINFER_FP8_GEMM": "0"}, "bf16"),
        ],
        "nvfp4": [
            ("nvfp4 (bf16 path)", {"NINFER_NVFP4_PREFILL": "bf16"}, "bf16"),
            (
                "nvfp4 (via FP8 GEMM)",
                {"NINFER_FP8_GEMM": "1", "NINFER_NVFP4_PREFILL": "fp8"},
                "fp8",
            ),
        ],
    }[dtype]
    out = []
    for label, env, fmt in variants:
        os.environ.update(env)
        first, seconds = prefill_seconds(runner, tokens)
        floor = floor_seconds(cfg, rates, fmt)
        out.append(
            {
                "shape": name,
                "dtype": dtype,
                "path": label,
                "load_s": load,
                "first_seconds": first,
                "seconds": seconds,
                "tokens_per_s": TOKENS / seconds,
                "floor_s": floor,
                "ratio": floor / seconds,
            }
        )
        print(
            f"[{name}] {label}: prefill {TOKENS} in {seconds * 1e3:.0f} ms "
            f"(first run {first * 1e3:.0f} ms) "
            f"({TOKENS / seconds:.0f} tok/s), "
            f"floor {floor * 1e3:.0f} ms ({100 * floor / seconds:.1f}%)",
            flush=True,
        )
    for key in ("NINFER_FP8_GEMM", "NINFER_FP8_FUSED", "NINFER_NVFP4_PREFILL"):
        os.environ.pop(key, None)
    del runner
    gc.collect()
    return out


def to_markdown(result: dict) -> str:
    r = result["rates"]
    fp8 = f"{r['fp8'] / 1e12:.0f} TFLOP/s" if r["fp8"] else "refused (see the log)"
    lines = [
        f"Rates (same process): bf16 GEMM 8192³ {r['bf16'] / 1e12:.0f} TFLOP/s, "
        f"FP8 block-scaled GEMM 8192³ {fp8}.",
        "",
        "| 27B matmul, 8192 tokens | " + " | ".join(GEMM_PATHS) + " |",
        "| --- |" + " ---: |" * len(GEMM_PATHS),
    ]
    for row in result["gemm"]:
        lines.append(
            f"| {row['name']} [{row['rows']} × {row['k']}] | "
            + " | ".join(cell(row[p]) for p in GEMM_PATHS)
            + " |"
        )
    lines += [
        "",
        "| shape | weights, path | prefill 8192 | tok/s | floor | of floor | vs bf16 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    bf16 = {p["shape"]: p["seconds"] for p in result["prefill"] if p["dtype"] == "bf16"}
    for p in result["prefill"]:
        base = bf16.get(p["shape"])
        speedup = f"{base / p['seconds']:.2f}×" if base else "–"
        lines.append(
            f"| {p['shape']} | {p['path']} | {p['seconds'] * 1e3:.0f} ms | "
            f"{p['tokens_per_s']:.0f} | "
            f"{p['floor_s'] * 1e3:.0f} ms | {100 * p['ratio']:.1f}% | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--shapes", default="qwen3.6-27b,qwen3.6-35b-a3b")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    kernels = _core.CudaFp8Gemm(0)
    rates = {"bf16": gemm_rate(), "fp8": fp8_gemm_rate(kernels)}
    torch.cuda.empty_cache()
    print(
        f"rates: bf16 GEMM {rates['bf16'] / 1e12:.0f} TFLOP/s, "
        f"FP8 block GEMM {rates['fp8'] / 1e12 if rates['fp8'] else float('nan'):.0f} TFLOP/s",
        flush=True,
    )
    result: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0),
        "rates": rates,
        "gemm": gemm_table(kernels),
        "prefill": [],
        "not_run": [],
    }
    del kernels
    for shape in args.shapes.split(","):
        for dtype in ("fp8", "bf16", "nvfp4"):
            if time.perf_counter() - start > args.budget_s:
                result["not_run"].append(f"{shape} {dtype}")
                continue
            try:
                result["prefill"] += run_shape(shape, dtype, rates)
            except Exception as exc:  # keep the other figures
                print(f"[{shape} {dtype}] FAILED: {type(exc).__name__}: {exc}", flush=True)
                result.setdefault("failures", []).append(f"{shape} {dtype}: {exc}")
            (args.out / "results_fp8_prefill.json").write_text(json.dumps(result, indent=2))
    text = to_markdown(result)
    if result["not_run"]:
        text += "\nnot run (time budget): " + ", ".join(result["not_run"]) + "\n"
    (args.out / "results_fp8_prefill.json").write_text(json.dumps(result, indent=2))
    (args.out / "results_fp8_prefill.md").write_text(text)
    print(text)
    return 1 if result.get("failures") else 0


if __name__ == "__main__":
    raise SystemExit(main())
