"""llama.cpp's llama-bench on random-valued GGUFs of a Qwen3.6 shape, as the peer of NInfer's
quantized decode and prefill (issue 14). Run by tools/gpu/llama_peer.sh on the GPU machine;
on the CPU with `--ngl 0 --no-copy-rate` (the tests' tiny shape).

    python bench/llama_peer.py --llama-bench BIN --out DIR \\
        [--preset qwen3.6-27b | qwen3.6-35b-a3b] [--ftypes q8_0 q4_k_m] [--layers N] [--reps 3]

For each format: write the GGUF (bench/gguf_random_qwen35.py) into a scratch folder (the
page cache's /dev/shm when it has room), run llama-bench twice with flash attention on and
every layer on the GPU — decode `-p 0 -n GEN -d 0,DEPTH` (tg at an empty and at a DEPTH-token
context) and prefill `-p PREFILL -n 0` — and delete the file. Writes llama_peer.json (every
llama-bench record, the timings of each stage) and llama_peer.md.

Decode floor, as NInfer's benchmarks define it: bytes one step must move ÷ the copy rate
measured here first (2 GiB device-to-device copy, bytes read + written, median of 20): the
weights in their stored format (all but the embedding table, of which a step reads one row;
of a mixture-of-experts shape's expert stacks only the experts one token is routed to), the f16
KV cache of the full-attention layers up to the depth, and the f32 delta-net state of the other
layers read and written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_random_qwen35 import (  # noqa: E402
    Shape,
    is_full_attention,
    nbytes,
    preset_shape,
    tensor_plan,
    weight_bytes_per_token,
    write_gguf,
)

LLAMA_CPP_SOURCE = "llama-cpp-python 0.3.36 sdist (vendor/llama.cpp)"


def copy_rate() -> float:
    """Device-to-device copy, bytes read + written per second (bench_cuda.py's definition)."""
    import torch

    n = 2 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for i in range(22):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (statistics.median(times) * 1e-3)


def state_bytes_per_token(shape: Shape, depth: int) -> int:
    """KV read at `depth` (f16 K and V of the full-attention layers) + delta-net state r + w."""
    full = sum(is_full_attention(shape, i) for i in range(shape.layers))
    kv = full * 2 * shape.kv_heads * shape.head_dim * 2 * depth
    gdn = (shape.layers - full) * shape.linear_v_heads * shape.linear_head_dim**2 * 4 * 2
    return kv + gdn


def matmul_params(shape: Shape) -> int:
    """Weights of the matrix products one token goes through (the lm_head included)."""
    h = shape.hidden
    key_dim = shape.linear_k_heads * shape.linear_head_dim
    value_dim = shape.linear_v_heads * shape.linear_head_dim
    q_rows = shape.heads * shape.head_dim
    kv_rows = shape.kv_heads * shape.head_dim
    full = sum(is_full_attention(shape, i) for i in range(shape.layers))
    attn = h * 2 * q_rows + 2 * h * kv_rows + q_rows * h
    gdn = (
        h * (2 * key_dim + value_dim) + h * value_dim + 2 * h * shape.linear_v_heads + value_dim * h
    )
    if shape.experts:  # router, the experts a token is routed to, the gated shared expert
        ffn = h * shape.experts + 3 * h * shape.expert_ffn * shape.experts_used
        ffn += 3 * h * shape.shared_ffn + h
    else:
        ffn = 3 * h * shape.ffn
    return shape.layers * ffn + full * attn + (shape.layers - full) * gdn + h * shape.vocab


def scratch_dir(need_bytes: int, requested: Path | None) -> Path:
    if requested is not None:
        return requested
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > need_bytes * 1.1:
        return shm
    return Path("/tmp")


def run_llama_bench(
    binary: Path, model: Path, extra: list[str], args: argparse.Namespace
) -> list[dict]:
    command = [
        str(binary),
        "-m",
        str(model),
        "-fa",
        "1",
        "-ngl",
        str(args.ngl),
        "-r",
        str(args.reps),
    ]
    command += ["-o", "json", *extra]
    if args.threads:
        command += ["-t", str(args.threads)]
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise RuntimeError(f"llama-bench exited with {done.returncode}")
    return json.loads(done.stdout)


def bench_format(ftype: str, shape: Shape, args: argparse.Namespace) -> dict[str, Any]:
    size = sum(nbytes(ne, kind) for _, ne, kind in tensor_plan(shape, ftype))
    folder = scratch_dir(size, args.scratch)
    model = folder / f"llama-peer-{args.preset}-{shape.layers}l-{ftype}.gguf"
    stages: dict[str, float] = {}
    try:
        start = time.perf_counter()
        file_bytes = write_gguf(model, shape, ftype, args.preset, threads=args.write_threads)
        stages["write_gguf_s"] = time.perf_counter() - start
        print(
            f"{ftype}: {file_bytes / 1e9:.2f} GB written to {folder} "
            f"in {stages['write_gguf_s']:.1f} s",
            flush=True,
        )
        records = []
        start = time.perf_counter()
        depths = ",".join(str(d) for d in args.depths)
        records += run_llama_bench(
            args.llama_bench, model, ["-p", "0", "-n", str(args.gen), "-d", depths], args
        )
        stages["decode_s"] = time.perf_counter() - start
        if args.prefill:
            start = time.perf_counter()
            records += run_llama_bench(
                args.llama_bench, model, ["-p", str(args.prefill), "-n", "0"], args
            )
            stages["prefill_s"] = time.perf_counter() - start
    finally:
        model.unlink(missing_ok=True)
    return {
        "ftype": ftype,
        "file_bytes": file_bytes,
        "scratch": str(folder),
        "stages": stages,
        "records": records,
    }


def rows(
    result: dict[str, Any], shape: Shape, copy_bytes_per_s: float | None
) -> list[dict[str, Any]]:
    weights = weight_bytes_per_token(shape, result["ftype"])
    out = []
    for r in result["records"]:
        decode = r["n_gen"] > 0
        row = {
            "ftype": result["ftype"],
            "test": f"tg{r['n_gen']}" if decode else f"pp{r['n_prompt']}",
            "depth": r.get("n_depth", 0),
            "tok_s": r["avg_ts"],
            "stddev": r["stddev_ts"],
            "samples": r["samples_ts"],
        }
        if decode and copy_bytes_per_s:
            moved = weights + state_bytes_per_token(shape, row["depth"])
            row["floor_tok_s"] = copy_bytes_per_s / moved
            row["of_floor"] = row["tok_s"] / row["floor_tok_s"]
        if not decode:
            row["matmul_tflop_s"] = 2 * matmul_params(shape) * row["tok_s"] / 1e12
        out.append(row)
    return out


def to_markdown(info: dict[str, Any], table: list[dict[str, Any]]) -> str:
    copy = info.get("copy_bytes_per_s")
    lines = [
        f"llama-bench ({info['source']}, {info['build']}) on random {info['preset']} x "
        f"{info['layers']} layers GGUFs; -fa 1 -ngl {info['ngl']} -r {info['reps']}, "
        f"f16 KV, ubatch/batch at llama-bench's defaults."
        + (f" Copy rate, same run: {copy / 1e12:.2f} TB/s." if copy else ""),
        "",
        "| format | test | context | tok/s | ± | floor tok/s | of floor | matmul TFLOP/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in table:
        floor = f"{r['floor_tok_s']:.1f}" if "floor_tok_s" in r else ""
        share = f"{100 * r['of_floor']:.1f}%" if "of_floor" in r else ""
        tflops = f"{r['matmul_tflop_s']:.1f}" if "matmul_tflop_s" in r else ""
        lines.append(
            f"| {r['ftype']} | {r['test']} | {r['depth']} | {r['tok_s']:.1f} | {r['stddev']:.1f} "
            f"| {floor} | {share} | {tflops} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bench", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="qwen3.6-27b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (multiple of 4)")
    parser.add_argument("--ftypes", nargs="+", default=["q8_0", "q4_k_m"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gen", type=int, default=128, help="decode tokens per test")
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 8192])
    parser.add_argument("--prefill", type=int, default=8192, help="0: no prefill test")
    parser.add_argument("--ngl", type=int, default=99)
    parser.add_argument("--threads", type=int, default=0, help="llama-bench -t (0: its default)")
    parser.add_argument("--write-threads", type=int, default=8)
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument("--no-copy-rate", action="store_true", help="no GPU: no floors")
    parser.add_argument("--build", default="CUDA sm_90a", help="how the binary was built")
    args = parser.parse_args(argv)
    shape = preset_shape(args.preset)
    if args.layers is not None:
        shape = Shape(**{**shape.__dict__, "layers": args.layers})
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    copy = None if args.no_copy_rate else copy_rate()
    if copy:
        print(f"copy rate {copy / 1e12:.2f} TB/s", flush=True)
    results = [bench_format(ftype, shape, args) for ftype in args.ftypes]
    table = [row for result in results for row in rows(result, shape, copy)]
    info = {
        "source": LLAMA_CPP_SOURCE,
        "build": args.build,
        "preset": args.preset,
        "layers": shape.layers,
        "ngl": args.ngl,
        "reps": args.reps,
        "copy_bytes_per_s": copy,
        "weight_bytes_per_token": {f: weight_bytes_per_token(shape, f) for f in args.ftypes},
        "total_s": time.perf_counter() - started,
    }
    (args.out / "llama_peer.json").write_text(
        json.dumps({"info": info, "table": table, "runs": results}, indent=2) + "\n"
    )
    text = to_markdown(info, table)
    (args.out / "llama_peer.md").write_text(text + "\n")
    print(text)
    print(f"total {info['total_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
