"""CUDA benchmark of FP8 (W8A16) and NVFP4 (W4A16) weights on the GPU machine.

In one process, ceilings first (bench_cuda.py's copy bandwidth and bf16 GEMM rate, and the FP8
block-scaled GEMM rate at 8192³):
1. the quantized GEMV alone at the Qwen3.6-27B decode shapes, m = 1/4/8/16, as a read rate
   (codes + scales ÷ time) against the copy bandwidth;
2. the 27B shape end to end per weight format and --kv-dtypes format (seeded random weights
   made on the device, formats as an fp8/nvfp4 artifact stores them: embedding, lm_head, the
   GDN a/b projections stay bf16): prefill 8k (floor: the dense matmuls' FLOPs at the GEMM rate
   of the path they take, FP8 weights the FP8 GEMM's, the rest at bf16's) and decode
   b1/4/8/16 at 1k and b1/4 at 8k context with CUDA graphs, against the byte floor (the step's
   weight bytes in their stored format + the KV cache in its format's page bytes + GDN state
   read and written) ÷ copy bandwidth; a per-kernel breakdown of a b1 decode step.

Writes results_quant.json / results_quant.md under --out and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
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

# (name, rows of each weight of one launch, k) of a 27B decode step
GEMV_SHAPES_27B = [
    ("gdn in_proj qkv+z", [10240, 6144], 5120),
    ("mlp gate+up", [17408, 17408], 5120),
    ("mlp down", [5120], 17408),
    ("gdn out_proj", [5120], 6144),
]


def step_weight_bytes(cfg: dict, dtype: str) -> float:
    """Bytes of the weights one decode step reads, each in its stored format (MoE experts:
    bf16, as the CUDA backend runs them; their expected distinct experts at batch 1)."""
    plan = plan_random_artifact(cfg, dtype=dtype)
    c = plan.config
    e, k = c.get("num_experts", 0) or 0, c.get("num_experts_per_tok", 0) or 0
    total = 0.0
    for name, (stored, shape) in plan.tensors.items():
        if name.startswith("mtp.") or name == "model.embed_tokens.weight":
            continue
        if ".mlp.experts." in name:
            total += 2 * math.prod(shape) * (k / e)
        else:
            total += tensor_nbytes(stored, shape)
    return total


# Launcher variants timed per shape and m (launchers_quant.h): the register-loading general
# kernel, the staged fp16 kernel, the ring kernel (8/16/32-row tiles, x per warp or staged in
# shared memory), the sector-shaped kernel (rows per tile, warps, units in flight) and the
# launcher's own choice.
GEMV_FORMS = [
    ("general", 4),
    ("staged", 12),
    ("ring8", 16),
    ("ring8-x", 17),
    ("ring16", 18),
    ("ring16-x", 19),
    ("ring32", 20),
    ("ring32-x", 21),
    ("sectors-r16w4u2", 24),
    ("sectors-r16w4u4", 25),
    ("sectors-r32w4u2", 26),
    ("sectors-r8w4u4", 27),
    ("sectors-r16w8u2", 28),
    ("sectors-r8w8u4", 29),
    ("sectors-r16w4u2-db", 30),
    ("sectors-r16w4u1-db", 31),
    ("sectors-r8w4u2-db", 32),
    ("sectors-r16w8u1-db", 33),
    ("sectors-r8w8u2-db", 34),
    ("sectors-r32w4u1-db", 35),
    ("auto", 0),
]


def gemv_rates(bw: float, dtypes: list[str]) -> list[dict]:
    """Each shape, m and form that applies (a form that does not take the shape raises)."""
    gemv = _core.CudaQuantGemv(0)
    rows = []
    forms = [f for f in GEMV_FORMS if f[0] in os.environ.get("GEMV_FORMS", f[0])]
    for dtype in dtypes:
        for name, weights, k in GEMV_SHAPES_27B:
            for m in (1, 4, 8, 16):
                for form, variant in forms:
                    try:
                        ms, nbytes = gemv.time_gemv(dtype, weights, k, m, variant, 20)
                    except (ValueError, RuntimeError):
                        continue
                    sec = float(np.median(ms)) * 1e-3
                    rows.append(
                        {
                            "dtype": dtype,
                            "shape": name,
                            "rows": sum(weights),
                            "k": k,
                            "m": m,
                            "form": form,
                            "variant": variant,
                            "us": sec * 1e6,
                            "tb_s": nbytes / sec / 1e12,
                            "ratio": nbytes / sec / bw,
                        }
                    )
                    r = rows[-1]
                    print(
                        f"gemv {dtype} {name} m={m} {form}: {r['us']:.1f} us, "
                        f"{r['tb_s']:.2f} TB/s ({100 * r['ratio']:.1f}% of copy)",
                        flush=True,
                    )
    return rows


def fastest_forms(rows: list[dict]) -> dict[str, int]:
    """The fastest explicit variant per (format, m, k, rows): NINFER_QUANT_GEMV_TABLE's keys."""
    best: dict[str, tuple[float, int]] = {}
    for r in rows:
        if r["variant"] == 0:
            continue
        key = f"{r['dtype']}/{r['m']}/{r['k']}/{r['rows']}"
        if key not in best or r["us"] < best[key][0]:
            best[key] = (r["us"], r["variant"])
    return {key: variant for key, (_, variant) in best.items()}


def prefill_format(dtype: str) -> str:
    """Whose GEMM rate bounds a format's prefill matmuls: FP8 weights run the FP8 block GEMM
    (unless NINFER_FP8_GEMM=0), NVFP4 (by default) and bf16 the bf16 one."""
    return "fp8" if dtype == "fp8" and os.environ.get("NINFER_FP8_GEMM", "1") != "0" else "bf16"


def run_model(
    name: str,
    dtype: str,
    kv_dtype: str,
    bw: float,
    rates: dict,
    steps: int,
    plan: list[tuple[int, list[int]]],
) -> dict:
    cfg = qwen3_5_preset(name)
    counts = shape_counts(cfg)
    kv_per_token = kv_bytes_per_token(counts, kv_dtype)
    weight_bytes = step_weight_bytes(cfg, dtype)
    lanes = max(max(b) for _, b in plan)
    max_ctx = max(8192, *(c for c, _ in plan))  # prefill 8192 too
    out: dict = {
        "shape": name,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "weight_gb_per_step": weight_bytes / 1e9,
        "kv_bytes_per_token": kv_per_token,
    }
    tag = f"{name} {dtype} kv {kv_dtype}"
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        t0 = time.perf_counter()
        runner = _core.ModelRunner(
            str(path),
            max_lanes=lanes,
            max_batch_tokens=16384,
            max_context=max_ctx + 8 * (steps + 4) + 64,
            device="cuda",
            random_weights_seed=1,
            random_weights_dtype=dtype,
            kv_dtype=kv_dtype,
        )
        out["load_s"] = time.perf_counter() - t0
    print(
        f"[{tag}] made on device in {out['load_s']:.1f} s; "
        f"{weight_bytes / 1e9:.2f} GB of weights per step",
        flush=True,
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, counts["vocab"], size=max(max_ctx, 8192) + 8).tolist()

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
        "tokens": 8192,
        "seconds": seconds,
        "tokens_per_s": 8192 / seconds,
        "floor_tokens_per_s": 8192 / floor,
        "ratio": floor / seconds,
        "floor_rate": fmt,
    }
    print(
        f"[{tag}] prefill 8192: {8192 / seconds:.0f} tok/s, {fmt}-GEMM floor "
        f"{8192 / floor:.0f} ({100 * floor / seconds:.1f}%)",
        flush=True,
    )

    rows = []
    for context, batches in plan:
        prefill_lanes(runner, tokens, context, lanes, filled=max(batches))
        position = [context] * lanes
        for batch in batches:

            def step(batch=batch, position=position):
                runner.forward_batch_sampled(
                    [(lane, position[lane], [tokens[lane]]) for lane in range(batch)],
                    [SAMPLING | {"uniform": (lane + 0.5) / batch} for lane in range(batch)],
                )
                for lane in range(batch):
                    position[lane] += 1

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            sec = (time.perf_counter() - t0) / steps
            c = shape_counts(cfg, batch)
            kv = batch * (position[0] - steps / 2) * kv_per_token
            state = batch * 2 * c["state_bytes_per_lane"]
            floor_step = (weight_bytes + kv + state) / bw
            rows.append(
                {
                    "context": context,
                    "batch": batch,
                    "step_ms": sec * 1e3,
                    "tokens_per_s": batch / sec,
                    "floor_tokens_per_s": batch / floor_step,
                    "ratio": floor_step / sec,
                }
            )
            r = rows[-1]
            print(
                f"[{tag}] decode ctx {context} b{batch}: {r['tokens_per_s']:.1f} "
                f"tok/s ({r['step_ms']:.2f} ms), floor {r['floor_tokens_per_s']:.1f} "
                f"({100 * r['ratio']:.1f}%)",
                flush=True,
            )
            if batch == 1 and "replay_b1" not in out:  # the b1 graph exists now
                rb = profile_replays(lambda: step(1), tag)
                if rb:
                    out["replay_b1"] = rb
    out["decode"] = rows
    os.environ["NINFER_CUDA_GRAPHS"] = "0"
    pos = position[0]
    out["breakdown_decode_b1"] = kernel_breakdown(
        lambda: runner.forward_batch_sampled([(0, pos, [tokens[2]])], [SAMPLING | {"uniform": 0.5}])
    )
    os.environ.pop("NINFER_CUDA_GRAPHS")
    return out


def to_markdown(result: dict) -> str:
    bw, rate = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["bf16_gemm_flops"]
    fp8_rate = result["ceilings"].get("fp8_gemm_flops") or float("nan")
    lines = [
        f"Ceilings (same run): copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s, "
        f"FP8 block GEMM {fp8_rate / 1e12:.0f} TFLOP/s.",
        "",
        "| GEMV (27B shapes) | format | m | kernel | µs | TB/s | of copy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["gemv"]:
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['m']} | {r['form']} | "
            f"{r['us']:.1f} | "
            f"{r['tb_s']:.2f} | {100 * r['ratio']:.1f}% |"
        )
    if result.get("gemv_table"):
        lines += ["", "Fastest variant per shape (NINFER_QUANT_GEMV_TABLE of the model runs):", ""]
        lines += [f"- {key}: {variant}" for key, variant in result["gemv_table"].items()]
    for model in result["models"]:
        lines += [
            "",
            f"### {model['shape']} {model['dtype']}, KV {model.get('kv_dtype', 'bf16')} "
            f"({model['weight_gb_per_step']:.2f} GB of weights per step)",
            "",
            "| what | measured | floor | ratio |",
            "| --- | --- | --- | --- |",
        ]
        p = model["prefill"]
        lines.append(
            f"| prefill 8192 | {p['tokens_per_s']:.0f} tok/s ({p['seconds']:.2f} s) | "
            f"{p['floor_tokens_per_s']:.0f} tok/s ({p.get('floor_rate', 'bf16')} GEMM) | "
            f"{100 * p['ratio']:.1f}% |"
        )
        for r in model["decode"]:
            lines.append(
                f"| decode b{r['batch']} {r['context']} ctx | {r['tokens_per_s']:.1f} "
                f"tok/s ({r['step_ms']:.2f} ms) | {r['floor_tokens_per_s']:.1f} tok/s "
                f"| {100 * r['ratio']:.1f}% |"
            )
        if "replay_b1" in model:
            lines += replay_markdown(model["replay_b1"])
        lines += ["", "decode b1 kernels (eager; name, ms, launches):"]
        lines += [f"- {n}: {ms:.2f} ms x {cnt}" for n, ms, cnt in model["breakdown_decode_b1"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--dtypes", default="fp8,nvfp4,bf16")
    parser.add_argument("--shape", default="qwen3.6-27b")
    parser.add_argument("--skip-gemv", action="store_true")
    parser.add_argument("--gemv-only", action="store_true", help="the GEMV rates, no model runs")
    parser.add_argument(
        "--pick-fastest",
        action="store_true",
        help="run the models with the fastest GEMV variant per measured shape "
        "(NINFER_QUANT_GEMV_TABLE) instead of the launcher's own choice",
    )
    parser.add_argument(
        "--contexts", default="1024:1,4,8,16;8192:1,4", help="decode plan: ctx:batches;..."
    )
    parser.add_argument("--kv-dtypes", default="bf16", help="KV cache formats, e.g. bf16,fp8")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dtypes = args.dtypes.split(",")
    result: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0),
        "ceilings": ceilings(),
        "gemv": [],
        "models": [],
    }
    bw, rate = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["bf16_gemm_flops"]
    fp8_rate = fp8_gemm_rate() if not args.gemv_only else None
    result["ceilings"]["fp8_gemm_flops"] = fp8_rate
    rates = {"bf16": rate, "fp8": fp8_rate}
    print(
        f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s, "
        f"FP8 block GEMM {fp8_rate / 1e12 if fp8_rate else float('nan'):.0f} TFLOP/s",
        flush=True,
    )
    if not args.skip_gemv:
        result["gemv"] = gemv_rates(bw, [d for d in dtypes if d != "bf16"])
        if args.pick_fastest:
            table = fastest_forms(result["gemv"])
            result["gemv_table"] = table
            os.environ["NINFER_QUANT_GEMV_TABLE"] = ",".join(f"{k}={v}" for k, v in table.items())
            print(f"model runs with the fastest GEMV per shape: {table}", flush=True)
    plan = [
        (int(c), [int(b) for b in bs.split(",")])
        for c, bs in (part.split(":") for part in args.contexts.split(";"))
    ]
    runs = [(d, kv) for d in dtypes for kv in args.kv_dtypes.split(",")]
    for dtype, kv_dtype in [] if args.gemv_only else runs:
        try:
            model = run_model(args.shape, dtype, kv_dtype, bw, rates, args.steps, plan)
            result["models"].append(model)
        except Exception as exc:  # keep the other formats' figures
            print(f"[{args.shape} {dtype} kv {kv_dtype}] FAILED: {type(exc).__name__}: {exc}")
            result.setdefault("failures", []).append(f"{dtype} kv {kv_dtype}: {exc}")
        (args.out / "results_quant.json").write_text(json.dumps(result, indent=2))
        torch.cuda.empty_cache()
    text = to_markdown(result)
    (args.out / "results_quant.md").write_text(text)
    print(text)
    return 1 if result.get("failures") else 0


if __name__ == "__main__":
    raise SystemExit(main())
