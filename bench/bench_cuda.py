"""CUDA backend benchmark on the GPU machine: ceilings, decode and prefill against their floors.

In one process: (1) the two ceilings, HBM copy bandwidth and the bf16 cuBLAS GEMM rate
(through torch, on random data); (2) a dense model of a real shape with seeded random bf16
weights made directly in device memory (a header-only artifact, no weight file); (3) prefill
tokens/s for an 8k prompt, floor = FLOPs / GEMM rate; (4) decode tokens/s at batch 1/4/8/16
with 1k and 8k context, floor = bytes per step / copy bandwidth; (5) a per-kernel time
breakdown of one decode step and one prefill through torch.profiler (CUPTI sees our kernels).
Prints a markdown table and writes results.json / results.md under --out.

Decode at long context shares one lane's cached prefix between lanes (ModelRunner.share_prefix):
each lane still reads its full context from the KV cache every step, so the bytes are real.
Every step copies the logits of each row to the host (no device sampling yet): that time is in
the measured figures.
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

from ninfer import _core

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402

from run_info import describe, run_info  # noqa: E402

# Dense stand-in for the Qwen3.6-27B shape (NOT the hybrid model: every layer is full attention).
DENSE_27B = {
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "vocab_size": 248320, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0, "max_position_embeddings": 262144,
}
SMALL = {  # for a quick run of the script itself
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
    "vocab_size": 32000, "tie_word_embeddings": False,
}


def events_median_ms(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def copy_bandwidth() -> float:
    n = 2 << 30  # 2 GiB each way, far past the 60 MB L2
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = events_median_ms(lambda: dst.copy_(src), 20)
    return 2 * n / (ms * 1e-3)


def gemm_rate(size: int = 8192) -> float:
    x = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    ms = events_median_ms(lambda: torch.matmul(x, y), 10, warmup=3)
    return 2 * size**3 / (ms * 1e-3)


def ceilings() -> dict[str, float]:
    result = {"copy_bytes_per_s": copy_bandwidth(), "bf16_gemm_flops": gemm_rate()}
    torch.cuda.empty_cache()
    return result


def shape_counts(cfg: dict) -> dict[str, float]:
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    qd = cfg["num_attention_heads"] * cfg["head_dim"]
    kvd = cfg["num_key_value_heads"] * cfg["head_dim"]
    per_layer = h * qd + 2 * h * kvd + qd * h + 3 * h * inter
    matmul_params = layers * per_layer + cfg["vocab_size"] * h  # + lm_head
    return {"matmul_params": matmul_params, "layer_params": layers * per_layer,
            "kv_bytes_per_token": layers * 2 * kvd * 2}


def attention_flops(cfg: dict, start: int, count: int) -> float:
    keys = sum(start + i + 1 for i in range(count))
    return 4.0 * cfg["num_attention_heads"] * cfg["head_dim"] * keys * cfg["num_hidden_layers"]


def kernel_breakdown(fn, top: int = 12) -> list[tuple[str, float, int]]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        total = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        if total > 0:
            rows.append((evt.key[:90], total / 1e3, evt.count))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def kernel_group(name: str) -> str:
    """A kernel's name without its namespaces, template and parameter lists."""
    base = name.removeprefix("void ").split("(")[0].split("<")[0]
    return base.rsplit("::", 1)[-1][:60] or name[:60]


def replay_breakdown(fn, steps: int = 5, top: int = 24) -> dict:
    """Where graph-replayed steps spend their time, on the critical path: each device activity
    (kernel or copy, in start order) is charged the time by which it moves the end of the work
    done so far, so overlapped (programmatic dependent launch) kernels are not counted twice and
    the charges plus the idle gaps inside a step add up to the step. Gaps over 200 us (the host
    between steps) are left out."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    spans = sorted(
        (e.time_range.start, e.time_range.end, kernel_group(e.name))
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    charged: dict[str, list[float]] = {}
    idle, done = 0.0, None
    for start, end, name in spans:
        if done is None:
            done = start
        gap = start - done
        if 0 < gap < 200:
            idle += gap
        charge = max(0.0, end - max(start, done))
        slot = charged.setdefault(name, [0.0, 0])
        slot[0] += charge
        slot[1] += 1
        done = max(done, end)
    rows = sorted(
        ((n, v[0] / steps / 1e3, v[1] / steps) for n, v in charged.items()),
        key=lambda r: -r[1],
    )
    return {
        "launches_per_step": len(spans) / steps,
        "busy_ms_per_step": sum(r[1] for r in rows),
        "idle_ms_per_step": idle / steps / 1e3,
        "kernels": rows[:top],
    }


def profile_replays(fn, label: str) -> dict | None:
    """replay_breakdown of fn (a step whose graph exists), printed; None if the profiler fails
    (it is a bonus: the caller keeps its timings)."""
    try:
        rb = replay_breakdown(fn)
    except Exception as exc:
        print(f"[{label}] b1 replay breakdown failed: {exc}", flush=True)
        return None
    print(
        f"[{label}] b1 replay: {rb['launches_per_step']:.0f} launches, busy "
        f"{rb['busy_ms_per_step']:.2f} ms + idle {rb['idle_ms_per_step']:.2f} ms a step",
        flush=True,
    )
    return rb


def replay_markdown(rb: dict) -> list[str]:
    """The lines of a results table's replay_breakdown block."""
    return [
        "",
        f"b1 graph replay, critical path ({rb['launches_per_step']:.0f} launches, busy "
        f"{rb['busy_ms_per_step']:.3f} ms + idle {rb['idle_ms_per_step']:.3f} ms a step; "
        "name, ms a step, launches a step):",
    ] + [f"- {n}: {ms:.3f} ms x {cnt:.0f}" for n, ms, cnt in rb["kernels"]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="a small shape (script check)")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = SMALL if args.small else DENSE_27B
    counts = shape_counts(cfg)
    result: dict = {**run_info(cuda=True), "config": cfg, "counts": counts}

    ceil = ceilings()
    result["ceilings"] = ceil
    bw, rate = ceil["copy_bytes_per_s"], ceil["bf16_gemm_flops"]
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s", flush=True)

    prompt_len, lanes = 8192, 16
    max_context = prompt_len + 4 * args.steps + 8 + 64
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        t0 = time.perf_counter()
        runner = _core.ModelRunner(str(path), max_lanes=lanes, max_batch_tokens=prompt_len,
                                   max_context=max_context, device="cuda", random_weights_seed=1)
        result["load_s"] = time.perf_counter() - t0
    print(f"model made on device in {result['load_s']:.1f} s "
          f"({counts['matmul_params'] * 2 / 1e9:.1f} GB of bf16 matmul weights)", flush=True)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg["vocab_size"], size=prompt_len + 8).tolist()

    # --- prefill -------------------------------------------------------------------------
    runner.forward(0, 0, tokens[:512])  # warm-up: cuBLAS handles, heuristics, module load
    runner.reset(0)
    prefill_times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.forward(0, 0, tokens[:prompt_len])
        prefill_times.append(time.perf_counter() - t0)
        runner.reset(0)
    prefill_s = min(prefill_times)
    flops = 2.0 * counts["layer_params"] * prompt_len + attention_flops(cfg, 0, prompt_len)
    flops += 2.0 * cfg["vocab_size"] * cfg["hidden_size"]  # one logits row
    floor_s = flops / rate
    result["prefill"] = {
        "tokens": prompt_len, "seconds": prefill_s, "tokens_per_s": prompt_len / prefill_s,
        "flops": flops, "floor_s": floor_s, "floor_tokens_per_s": prompt_len / floor_s,
        "ratio": floor_s / prefill_s}
    print(f"prefill {prompt_len}: {prompt_len / prefill_s:.0f} tok/s, "
          f"floor {prompt_len / floor_s:.0f} ({100 * floor_s / prefill_s:.1f}%)", flush=True)

    # --- decode --------------------------------------------------------------------------
    weight_bytes = 2.0 * counts["matmul_params"]
    decode_rows = []
    for context in (1024, 8192):
        for lane in range(lanes - 1, -1, -1):
            runner.reset(lane)
        runner.forward(0, 0, tokens[:context])
        for lane in range(1, lanes):
            runner.share_prefix(0, lane, context)
        position = [context] * lanes
        for batch in (1, 4, 8, 16):
            def step(batch=batch, position=position):
                items = [(lane, position[lane], [tokens[lane]]) for lane in range(batch)]
                runner.forward_batch(items)
                for lane in range(batch):
                    position[lane] += 1

            step()  # warm-up (GEMV/cuBLAS choice for this m)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            seconds = (time.perf_counter() - t0) / args.steps
            kv_bytes = batch * (context + args.steps / 2) * counts["kv_bytes_per_token"]
            floor_step = (weight_bytes + kv_bytes) / bw
            row = {"context": context, "batch": batch, "step_ms": seconds * 1e3,
                   "tokens_per_s": batch / seconds, "floor_tokens_per_s": batch / floor_step,
                   "ratio": floor_step / seconds}
            decode_rows.append(row)
            print(f"decode ctx {context} batch {batch}: {row['tokens_per_s']:.1f} tok/s "
                  f"({row['step_ms']:.2f} ms/step), floor {row['floor_tokens_per_s']:.1f} "
                  f"({100 * row['ratio']:.1f}%)", flush=True)
    result["decode"] = decode_rows

    # --- per-kernel breakdown ------------------------------------------------------------
    for lane in range(lanes - 1, -1, -1):
        runner.reset(lane)
    runner.forward(0, 0, tokens[:8192])
    result["breakdown_decode_b1_8k"] = kernel_breakdown(
        lambda: runner.forward(0, 8192, [tokens[1]]))
    runner.reset(0)
    result["breakdown_prefill_8k"] = kernel_breakdown(
        lambda: runner.forward(0, 0, tokens[:prompt_len]))

    lines = [f"## GPU — {describe(result)}", "",
             f"Ceilings (measured in the same run): copy {bw / 1e12:.2f} TB/s (read+write), "
             f"bf16 GEMM 8192³ {rate / 1e12:.0f} TFLOP/s.", "",
             "| what | measured | floor | ratio |", "| --- | --- | --- | --- |"]
    p = result["prefill"]
    lines.append(f"| prefill {prompt_len} tokens | {p['tokens_per_s']:.0f} tok/s "
                 f"({p['seconds']:.2f} s) | {p['floor_tokens_per_s']:.0f} tok/s "
                 f"| {100 * p['ratio']:.1f}% |")
    for r in decode_rows:
        lines.append(f"| decode batch {r['batch']}, {r['context']} ctx "
                     f"| {r['tokens_per_s']:.1f} tok/s "
                     f"({r['step_ms']:.2f} ms/step) | {r['floor_tokens_per_s']:.1f} tok/s "
                     f"| {100 * r['ratio']:.1f}% |")
    for key in ("breakdown_decode_b1_8k", "breakdown_prefill_8k"):
        lines += ["", f"{key} (kernel, total ms, launches):", ""]
        lines += [f"- {name}: {ms:.2f} ms × {count}" for name, ms, count in result[key]]
    text = "\n".join(lines)
    (args.out / "results.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
