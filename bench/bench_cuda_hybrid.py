"""CUDA benchmark of the real Qwen3.6 hybrid shapes (27B dense, 35B-A3B MoE) on the GPU machine.

Per shape, in one process with the ceilings measured first (bench_cuda.py's copy bandwidth
and bf16 GEMM rate): seeded random bf16 weights made directly in device memory from a
header-only artifact; prefill tokens/s for an 8k prompt (floor = FLOPs / GEMM rate); decode
tokens/s at batch 1/4/8/16 with 1k and 8k context (floor = bytes per step / copy bandwidth:
the weights a step reads, the KV cache of the 16 full-attention layers, the GDN recurrent and
conv states read and written); a per-kernel breakdown of a batch-1 decode step; and the GDN
layer core alone (conv, norms, gates, delta rule, gated norm) at decode shapes, against the
bytes of its state. Decode is timed with decode CUDA graphs on and off (NINFER_CUDA_GRAPHS,
read by the backend at every step), and optionally with the GEMVs launched without overlapping
the previous kernel (--modes ...-nopdl: NINFER_CUDA_PDL=0, also read at every step). Hybrid
lanes cannot share a prefix (their recurrent state would be wrong), so every lane is
prefilled; lanes are prefilled together, 2 at a time.

Writes results_hybrid.json / results_hybrid.md under --out and prints the table.
"""

from __future__ import annotations

import argparse
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
from ninfer.convert.qwen3_5_presets import qwen3_5_preset
from ninfer.convert.random import plan_random_artifact

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402

from bench_cuda import ceilings, kernel_breakdown  # noqa: E402
from run_info import describe, run_info  # noqa: E402

SAMPLING = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


def prefill_lanes(
    runner, tokens: list[int], context: int, lanes: int, filled: int | None = None
) -> None:
    """Resets lanes [0, lanes) and gives the first `filled` (default: all) `context` tokens of
    real state, two lanes a traversal; odd lanes start one token later so their contents
    differ."""
    filled = lanes if filled is None else filled
    for lane in range(lanes):
        runner.reset(lane)
    for lane in range(0, filled, 2):
        runner.forward_batch(
            [
                (ln, 0, tokens[ln % 2 : context + ln % 2])
                for ln in range(lane, min(lane + 2, filled))
            ]
        )


def shape_counts(cfg: dict, batch: int = 1) -> dict[str, float]:
    """Parameters read per decode step (MoE: the expected distinct experts of `batch` tokens
    under uniform routing) and active per token, state and KV bytes."""
    plan = plan_random_artifact(cfg)
    c = plan.config
    dense, experts = 0, 0
    for name, (_, shape) in plan.tensors.items():
        if name.startswith("mtp.") or name == "model.embed_tokens.weight":
            continue  # the MTP head is not run; one embedding row per token is negligible
        n = math.prod(shape)
        if ".mlp.experts." in name:
            experts += n
        else:
            dense += n
    layers = c["num_hidden_layers"]
    interval = c.get("full_attention_interval", 4)
    attn_layers = layers // interval
    gdn_layers = layers - attn_layers
    hv, dk, dv = c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    hk = c["linear_num_key_heads"]
    conv_ch = 2 * hk * dk + hv * dv
    e = c.get("num_experts", 0) or 0
    k = c.get("num_experts_per_tok", 0) or 0
    per_expert = experts / e if e else 0
    distinct = e * (1 - (1 - k / e) ** batch) if e else 0
    return {
        "dense_params": dense,
        "expert_params": experts,
        "read_params": dense + distinct * per_expert,
        "active_params": dense + k * per_expert,
        "state_bytes_per_lane": gdn_layers
        * (hv * dk * dv + (c.get("linear_conv_kernel_dim", 4) - 1) * conv_ch)
        * 4,
        "kv_bytes_per_token": attn_layers * 2 * c["num_key_value_heads"] * c["head_dim"] * 2,
        "attn_layers": attn_layers,
        "gdn_layers": gdn_layers,
        "hv": hv,
        "hk": hk,
        "dk": dk,
        "dv": dv,
        "heads": c["num_attention_heads"],
        "head_dim": c["head_dim"],
        "vocab": c["vocab_size"],
        "hidden": c["hidden_size"],
    }


def prefill_flops(counts: dict, tokens: int) -> float:
    matmul = 2.0 * counts["active_params"] * tokens
    keys = tokens * (tokens + 1) / 2
    attention = 4.0 * counts["heads"] * counts["head_dim"] * keys * counts["attn_layers"]
    gdn = (
        8.0 * counts["hv"] * counts["dk"] * counts["dv"] * tokens * counts["gdn_layers"]
    )  # recurrent form
    lm_head = 2.0 * counts["vocab"] * counts["hidden"]  # one logits row
    return matmul + attention + gdn + lm_head - 2.0 * counts["vocab"] * counts["hidden"] * tokens


def decode_row(
    cfg: dict, bw: float, context: int, batch: int, sec: float, mean_pos: float, graphs: bool
) -> dict:
    c = shape_counts(cfg, batch)
    kv = batch * mean_pos * c["kv_bytes_per_token"]
    state = batch * 2 * c["state_bytes_per_lane"]  # read + write
    floor_step = (2.0 * c["read_params"] + kv + state) / bw
    return {
        "context": context,
        "batch": batch,
        "graphs": graphs,
        "step_ms": sec * 1e3,
        "tokens_per_s": batch / sec,
        "floor_tokens_per_s": batch / floor_step,
        "ratio": floor_step / sec,
        "weight_gb": 2.0 * c["read_params"] / 1e9,
        "kv_gb": kv / 1e9,
        "state_gb": state / 1e9,
    }


def run_shape(
    name: str,
    bw: float,
    rate: float,
    steps: int,
    contexts: list[int],
    decode_only: bool,
    batches: list[int],
    modes: list[str],
) -> dict:
    cfg = qwen3_5_preset(name)
    lanes, prompt_len = max(batches), 8192
    counts = shape_counts(cfg)
    out: dict = {"shape": name, "counts": counts}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        t0 = time.perf_counter()
        runner = _core.ModelRunner(
            str(path),
            max_lanes=lanes,
            max_batch_tokens=2 * max(contexts),
            max_context=max(contexts) + 8 * (steps + 4) + 64,
            device="cuda",
            random_weights_seed=1,
        )
        out["load_s"] = time.perf_counter() - t0
    print(
        f"[{name}] made on device in {out['load_s']:.1f} s; {counts['read_params'] / 1e9:.2f} B "
        f"params read per b1 step, {counts['active_params'] / 1e9:.2f} B active",
        flush=True,
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, counts["vocab"], size=prompt_len + 8).tolist()

    if not decode_only:
        runner.forward(0, 0, tokens[:256])  # warm-up
        runner.reset(0)
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runner.forward(0, 0, tokens[:prompt_len])
            times.append(time.perf_counter() - t0)
            runner.reset(0)
        seconds = min(times)
        flops = prefill_flops(counts, prompt_len)
        floor = flops / rate
        out["prefill"] = {
            "tokens": prompt_len,
            "seconds": seconds,
            "tokens_per_s": prompt_len / seconds,
            "flops": flops,
            "floor_s": floor,
            "floor_tokens_per_s": prompt_len / floor,
            "ratio": floor / seconds,
        }
        print(
            f"[{name}] prefill {prompt_len}: {prompt_len / seconds:.0f} tok/s, floor "
            f"{prompt_len / floor:.0f} ({100 * floor / seconds:.1f}%)",
            flush=True,
        )

    rows = []
    for context in contexts:
        prefill_lanes(runner, tokens, context, lanes)
        position = [context] * lanes
        for batch in batches:

            def step(batch=batch, position=position):
                # As the engine decodes: the next token is sampled on the device (Qwen3.6's
                # recommended T 0.6 / top-k 20 / top-p 0.95), only the ids come back.
                runner.forward_batch_sampled(
                    [(lane, position[lane], [tokens[lane]]) for lane in range(batch)],
                    [SAMPLING | {"uniform": (lane + 0.5) / batch} for lane in range(batch)],
                )
                for lane in range(batch):
                    position[lane] += 1

            for mode in modes:
                graphs = not mode.startswith("eager")
                os.environ["NINFER_CUDA_GRAPHS"] = "1" if graphs else "0"
                os.environ["NINFER_CUDA_PDL"] = "0" if mode.endswith("-nopdl") else "1"
                for _ in range(3):  # warm-up: GEMV/cuBLAS choice, then the graph's capture
                    step()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                sec = (time.perf_counter() - t0) / steps
                rows.append(
                    decode_row(cfg, bw, context, batch, sec, position[0] - steps / 2, graphs)
                )
                r = rows[-1]
                r["mode"] = mode
                print(
                    f"[{name}] decode ctx {context} batch {batch} {mode}: "
                    f"{r['tokens_per_s']:.1f} tok/s ({r['step_ms']:.2f} ms/step), floor "
                    f"{r['floor_tokens_per_s']:.1f} ({100 * r['ratio']:.1f}%)",
                    flush=True,
                )
            os.environ.pop("NINFER_CUDA_GRAPHS")
            os.environ.pop("NINFER_CUDA_PDL")
    out["decode"] = rows
    pos = position[0]
    os.environ["NINFER_CUDA_GRAPHS"] = "0"  # per-kernel figures of the eager step
    out["breakdown_decode_b1"] = kernel_breakdown(
        lambda: runner.forward_batch_sampled([(0, pos, [tokens[2]])], [SAMPLING | {"uniform": 0.5}])
    )
    os.environ.pop("NINFER_CUDA_GRAPHS")
    if decode_only:
        return out
    runner.reset(0)
    out["breakdown_prefill"] = kernel_breakdown(
        lambda: runner.forward(0, 0, tokens[:prompt_len]), top=16
    )
    runner = None  # free the weights before the kernel timings
    torch.cuda.empty_cache()

    ops = _core.CudaHybridOps(0)
    gdn = []
    for lanes_n, toks in ((1, 1), (16, 1), (1, 8192)):
        t = ops.time_gdn_core(
            lanes_n, toks, counts["hk"], counts["hv"], counts["dk"], counts["dv"], 10
        )
        state = lanes_n * counts["hv"] * counts["dk"] * counts["dv"] * 4 * 2
        t["lanes"], t["tokens"] = lanes_n, toks
        t["delta_rule_state_tb_s"] = state / (t["delta_rule"] * 1e-3) / 1e12
        gdn.append(t)
        print(
            f"[{name}] GDN core, {lanes_n} lane(s) x {toks} token(s): "
            + ", ".join(f"{k} {v:.3f}" for k, v in t.items() if isinstance(v, float)),
            flush=True,
        )
    out["gdn_core_ms"] = gdn
    return out


def to_markdown(result: dict) -> str:
    bw, rate = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["bf16_gemm_flops"]
    lines = [
        f"Run: {describe(result)}.",
        "",
        f"Ceilings (same run): copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s.",
        "",
    ]
    for shape in result["shapes"]:
        lines += [
            f"### {shape['shape']}",
            "",
            "| what | measured | floor | ratio |",
            "| --- | --- | --- | --- |",
        ]
        if "prefill" in shape:
            p = shape["prefill"]
            lines.append(
                f"| prefill {p['tokens']} | {p['tokens_per_s']:.0f} tok/s ({p['seconds']:.2f} s) "
                f"| {p['floor_tokens_per_s']:.0f} tok/s | {100 * p['ratio']:.1f}% |"
            )
        for r in shape["decode"]:
            graphs = r.get("mode", "graphs on" if r["graphs"] else "graphs off")
            lines.append(
                f"| decode b{r['batch']} {r['context']} ctx, {graphs} "
                f"| {r['tokens_per_s']:.1f} tok/s "
                f"({r['step_ms']:.2f} ms) | {r['floor_tokens_per_s']:.1f} tok/s "
                f"| {100 * r['ratio']:.1f}% |"
            )
        lines += ["", "decode b1 kernels (name, ms, launches):"]
        lines += [f"- {n}: {ms:.2f} ms x {cnt}" for n, ms, cnt in shape["breakdown_decode_b1"]]
        if "breakdown_prefill" not in shape:
            lines.append("")
            continue
        lines += ["", "prefill 8k kernels (name, ms, launches):"]
        lines += [f"- {n}: {ms:.2f} ms x {cnt}" for n, ms, cnt in shape["breakdown_prefill"]]
        lines += [
            "",
            "GDN core per layer (ms): "
            + "; ".join(
                f"{g['lanes']}x{g['tokens']}: "
                + ", ".join(f"{k} {v:.3f}" for k, v in g.items() if isinstance(v, float))
                for g in shape["gdn_core_ms"]
            ),
            "",
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--shapes", default="qwen3.6-27b,qwen3.6-35b-a3b")
    parser.add_argument("--decode-only", action="store_true", help="skip prefill and GDN timings")
    parser.add_argument("--batches", default="1,4,8,16", help="decode batch sizes")
    parser.add_argument("--contexts", default="1024,8192", help="decode context lengths")
    parser.add_argument(
        "--modes",
        default="graphs,eager",
        help="decode modes: graphs, eager; a -nopdl suffix launches GEMVs without overlap",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {
        **run_info(cuda=True),
        "ceilings": ceilings(),
        "shapes": [],
    }
    bw, rate = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["bf16_gemm_flops"]
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s", flush=True)
    for name in args.shapes.split(","):
        try:
            result["shapes"].append(
                run_shape(
                    name,
                    bw,
                    rate,
                    args.steps,
                    [int(c) for c in args.contexts.split(",")],
                    args.decode_only,
                    [int(b) for b in args.batches.split(",")],
                    args.modes.split(","),
                )
            )
        except Exception as exc:  # keep the other shape's figures
            print(f"[{name}] FAILED: {type(exc).__name__}: {exc}", flush=True)
            result.setdefault("failures", []).append(f"{name}: {exc}")
        (args.out / "results_hybrid.json").write_text(json.dumps(result, indent=2))
        torch.cuda.empty_cache()
    text = to_markdown(result)
    (args.out / "results_hybrid.md").write_text(text + "\n")
    print(text)
    return 1 if result.get("failures") else 0


if __name__ == "__main__":
    raise SystemExit(main())
