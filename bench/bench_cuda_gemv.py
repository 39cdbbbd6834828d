"""CUDA benchmark of the hand bf16 GEMV on every Qwen3.6-27B decode matmul shape (GPU machine).

Per shape (one launch of the backend's matmul_many: the q/k/v or GDN in_proj weights share a
launch) and batch m, the median device time (CUDA events around each launch) of every GEMV
variant (_core.CudaGemv.variants(); "auto" is the launcher's own choice) and of the backend's
cuBLAS path (x to bf16, then one GEMM per weight), as GB/s of weights read and the ratio to two
ceilings measured in the same run: the device-to-device copy rate (bytes read + written) and a
read-only stream (bytes read). Weight copies are cycled so that every launch reads from HBM.
Ends with the matmul time of one batch-1 decode step of the 27B model per variant.

    python3 bench/bench_cuda_gemv.py [--batches 1,4,8,16] [--reps 20] [--variants all|auto]
        [--shapes "a|b,lm_head"]
"""

from __future__ import annotations

import argparse
import statistics

from ninfer import _core

HIDDEN, FF, VOCAB = 5120, 17408, 248320
# (name, rows of each weight in the launch, k, launches per bf16 decode step; 0: not in the bf16
# step, timed alone — the GDN a/b projections that quantized models launch by themselves)
SHAPES = [
    ("attn q|k|v", [12288, 1024, 1024], HIDDEN, 16),
    ("gdn in_proj qkv|z|b|a", [10240, 6144, 48, 48], HIDDEN, 48),
    ("mlp gate|up", [FF, FF], HIDDEN, 64),
    ("o_proj / out_proj", [HIDDEN], 6144, 64),
    ("mlp down", [HIDDEN], FF, 64),
    ("lm_head", [VOCAB], HIDDEN, 1),
    ("gdn a|b alone (fp8/nvfp4 27B)", [48, 48], HIDDEN, 0),
    ("gdn a|b alone (fp8/nvfp4 35B-A3B)", [32, 32], 2048, 0),
]
AUTO, CUBLAS = -1, _core.CudaGemv.cublas_variant if hasattr(_core, "CudaGemv") else -2


def median_ms(times: list[float]) -> float:
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--variants", default="all", help="all: every variant; auto: the default")
    parser.add_argument("--shapes", default="", help="only shapes whose name contains one of these")
    args = parser.parse_args()
    gemv = _core.CudaGemv(0)
    names = gemv.variants()
    variants = [AUTO] + (list(range(len(names))) if args.variants == "all" else [])
    labels = {AUTO: "auto", CUBLAS: "cublas", **{i: f"v{i}" for i in range(len(names))}}
    print("variants: " + "; ".join(f"v{i} = {n}" for i, n in enumerate(names)), flush=True)

    gib = 1 << 30
    copy_bw = 2 * gib / (median_ms(gemv.time_copy(gib, 20)) * 1e-3)
    read_bw = gib / (median_ms(gemv.time_read(gib, 20)) * 1e-3)
    print(
        f"ceilings: copy {copy_bw / 1e12:.3f} TB/s (read + write), "
        f"read-only stream {read_bw / 1e12:.3f} TB/s",
        flush=True,
    )

    step_ms: dict[tuple[int, int], float] = {}
    best: dict[tuple[int, str], tuple[float, int]] = {}  # (m, shape) -> (step ms, variant)
    step_bytes = 0.0
    step_read_ms = 0.0  # the step's matmul bytes as same-size read-only streams
    wanted = [w for w in args.shapes.split(",") if w]
    for name, rows, k, per_step in SHAPES:
        if wanted and not any(w in name for w in wanted):
            continue
        weight_bytes = 2.0 * sum(rows) * k
        step_bytes += per_step * weight_bytes
        # The same bytes read by the read-only stream kernel: the ceiling at this size, launch
        # and ramp included.
        read_ms = median_ms(gemv.time_read(int(weight_bytes), args.reps))
        step_read_ms += per_step * read_ms
        print(
            f"[{name}] read-only stream of the same {weight_bytes / 1e6:.1f} MB: "
            f"{read_ms * 1e3:.1f} us ({weight_bytes / (read_ms * 1e-3) / 1e12:.2f} TB/s)",
            flush=True,
        )
        for m in (int(b) for b in args.batches.split(",")):
            cells = []
            for v in [*variants, CUBLAS]:
                try:
                    ms = median_ms(gemv.time_gemv(rows, k, m, v, args.reps))
                except RuntimeError as exc:  # e.g. cuBLAS not loadable
                    cells.append(f"{labels[v]} n/a ({exc})")
                    continue
                bw = weight_bytes / (ms * 1e-3)
                step_ms[(m, v)] = step_ms.get((m, v), 0.0) + per_step * ms
                better = (m, name) not in best or per_step * ms < best[(m, name)][0]
                if v >= 0 and per_step and better:
                    best[(m, name)] = (per_step * ms, v)
                cells.append(
                    f"{labels[v]} {ms * 1e3:7.1f} us {bw / 1e12:.2f} TB/s "
                    f"({100 * bw / copy_bw:.0f}% copy, {100 * bw / read_bw:.0f}% read, "
                    f"{100 * read_ms / ms:.0f}% same-size read)"
                )
            print(
                f"[{name} k={k} rows={'+'.join(map(str, rows))} m={m}] "
                f"{weight_bytes / 1e6:.1f} MB:\n    " + "\n    ".join(cells),
                flush=True,
            )

    if step_bytes == 0:  # only shapes outside the bf16 step were timed
        return 0
    print(
        f"27B decode step matmuls: {step_bytes / 1e9:.2f} GB of weights; floor at the copy rate "
        f"{step_bytes / copy_bw * 1e3:.2f} ms, at the read rate {step_bytes / read_bw * 1e3:.2f} ms"
    )
    print(
        f"  read-only streams of each launch's bytes: {step_read_ms:.2f} ms a step "
        f"({100 * step_bytes / copy_bw * 1e3 / step_read_ms:.1f}% of the copy floor)"
    )
    for (m, v), ms in sorted(step_ms.items()):
        print(
            f"  m={m} {labels[v]:>6}: {ms:.2f} ms of matmuls a step "
            f"({100 * step_bytes / copy_bw * 1e3 / ms:.1f}% of the copy floor)"
        )
    for m in sorted({m for m, _ in best}):
        picks = [best[(m, name)] for name, *_ in SHAPES if (m, name) in best]
        total = sum(ms for ms, _ in picks)
        print(
            f"  m={m}  best GEMV variant per shape: {total:.2f} ms a step "
            f"({100 * step_bytes / copy_bw * 1e3 / total:.1f}% of the copy floor): "
            + ", ".join(labels[v] for _, v in picks)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
