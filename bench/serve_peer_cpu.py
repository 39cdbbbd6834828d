"""ninfer-serve against llama.cpp's own HTTP server on the CPU: the same GGUF file, the same
thread count, the same bench_serve.py workload, in one run, alternating between the servers.

    python bench/gguf_to_q8_0.py SmolLM2-135M-Instruct.Q4_1.gguf smol-q8_0.gguf
    tools/llama_cpp_build.sh /tmp/llama cpu   # llama-server from the pinned source, -march=native
    python bench/serve_peer_cpu.py smol-q8_0.gguf \\
        --peer-server /tmp/llama/build-cpu/bin/llama-server \\
        --out results/ --rounds 2
    # or the prebuilt wheel (built without -march=native: AVX2 at most):
    pip install xllamacpp
    python bench/serve_peer_cpu.py smol-q8_0.gguf --peer-python /path/to/venv/bin/python ...

Both servers run for the whole comparison (an idle server's threads sleep), each with
`--lanes` slots; each round runs every concurrency on every server, the servers' order
flipping between rounds so that neither always runs first. Extra NInfer contenders with
other CPU kernel sets (`--ninfer-kernels avx2`, NINFER_CPU_KERNELS) show how much of a
difference is the instruction set: the prebuilt llama.cpp wheel is built without
-march=native, a llama-server built by tools/llama_cpp_build.sh with it (the peer's system info
line is recorded either way). Writes one bench_serve.py result per run,
results_peer.json and results_peer.md (medians over rounds of TTFT and output tok/s, and
NInfer ÷ llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, port: int, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server on port {port} not ready within {timeout_s} s")


def start_servers(args: argparse.Namespace, logs: Path) -> dict[str, tuple[subprocess.Popen, int]]:
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    for kernels in [None, *args.ninfer_kernels]:
        name = "ninfer" if kernels is None else f"ninfer-{kernels}"
        port = free_port()
        own = dict(env)
        if kernels is not None:
            own["NINFER_CPU_KERNELS"] = kernels
        command = [
            sys.executable,
            "-m",
            "ninfer.server",
            str(args.gguf),
            "--port",
            str(port),
            "--max-concurrency",
            str(args.lanes),
            "--log-stats-interval-ms",
            "0",
        ]
        log = open(logs / f"{name}.log", "w")  # noqa: SIM115 - lives as long as the server
        servers[name] = (subprocess.Popen(command, stdout=log, stderr=log, env=own), port)
    port = free_port()
    context = args.lanes * (args.input_len + args.output_len + 128)
    if args.peer_server is not None:
        # llama-server's own flags, the same settings llama_cpp_server.py gives the wheel.
        command = [
            str(args.peer_server),
            "-m",
            str(args.gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            str(args.threads),
            "-tb",
            str(args.threads),
            "-np",
            str(args.lanes),
            "-c",
            str(context),
            "-b",
            "2048",
            "--alias",
            args.gguf.stem,
        ]
    else:
        command = [
            args.peer_python,
            str(BENCH / "llama_cpp_server.py"),
            str(args.gguf),
            "--port",
            str(port),
            "--threads",
            str(args.threads),
            "--parallel",
            str(args.lanes),
            "--ctx-size",
            str(context),
        ]
    log = open(logs / "llama.cpp.log", "w")  # noqa: SIM115
    # The wheel's ggml uses OpenMP, whose threads spin between operations by default: on a
    # shared machine a spinning thread that is preempted stalls every barrier (measured here
    # under load 12-15: 1.7 tok/s spinning against 65-79 tok/s passive).
    peer_env = {**os.environ, "OMP_WAIT_POLICY": args.peer_omp_wait_policy}
    servers["llama.cpp"] = (
        subprocess.Popen(command, stdout=log, stderr=log, env=peer_env),
        port,
    )
    return servers


def peer_system_info(args: argparse.Namespace) -> str:
    """The peer's "CPU : SSE3 = 1 | ..." line: printed by llama_cpp_server.py into its log; a
    llama-server logs it only at trace verbosity, so it is asked separately, with no model
    (it prints the line, fails to load and exits)."""
    if args.peer_server is not None:
        probe = [str(args.peer_server), "-lv", "4", "-m", "/nonexistent.gguf"]
        probe += ["-t", str(args.threads)]
        done = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        lines = (done.stdout + done.stderr).splitlines()
    else:
        lines = (args.out / "llama.cpp.log").read_text().splitlines()
    found = (line[line.index("CPU :") :].strip() for line in lines if "CPU :" in line)
    return next(found, "unknown")


def run_bench(
    port: int, c: int, seed: int, args: argparse.Namespace, result: Path
) -> dict[str, Any]:
    command = [
        sys.executable,
        str(BENCH / "bench_serve.py"),
        "--port",
        str(port),
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(c * args.waves),
        "--max-concurrency",
        str(c),
        "--seed",
        str(seed),
        "--result-file",
        str(result),
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.read_text())


def load_average() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def summarize(runs: list[dict[str, Any]], names: list[str], levels: list[int]) -> dict:
    table: dict[str, dict[int, dict[str, float]]] = {}
    for name in names:
        table[name] = {}
        for c in levels:
            mine = [r for r in runs if r["server"] == name and r["concurrency"] == c]
            table[name][c] = {
                "output_tok_s": statistics.median(r["output_throughput"] for r in mine),
                "ttft_ms": statistics.median(r["median_ttft_ms"] for r in mine),
                "tpot_ms": statistics.median(r["median_tpot_ms"] for r in mine),
                "rounds": len(mine),
                "per_round_output_tok_s": [round(r["output_throughput"], 1) for r in mine],
            }
    return table


def to_markdown(table: dict, levels: list[int], info: dict[str, Any]) -> str:
    lines = [
        f"Model {info['model']}, {info['input_len']}-token random prompts, "
        f"{info['output_len']} output tokens (ignore_eos, greedy), {info['lanes']} slots each, "
        f"threads {info['threads']}; {info['rounds']} rounds alternating; load average "
        f"{info['load_before']:.1f} before, {info['load_after']:.1f} after.",
        f"llama.cpp ({info['peer']}): {info['peer_system_info']} "
        f"OMP_WAIT_POLICY={info['peer_omp_wait_policy']}",
        "",
        "| server | c | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | output tok/s per round "
        "| ÷ llama.cpp (tok/s) | ÷ llama.cpp (TTFT) |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    peer = table.get("llama.cpp", {})
    for name, rows in table.items():
        for c in levels:
            r = rows[c]
            ratio = r["output_tok_s"] / peer[c]["output_tok_s"] if c in peer else None
            ttft = r["ttft_ms"] / peer[c]["ttft_ms"] if c in peer else None
            lines.append(
                f"| {name} | {c} | {r['output_tok_s']:.1f} | {r['ttft_ms']:.0f} "
                f"| {r['tpot_ms']:.1f} | {', '.join(map(str, r['per_round_output_tok_s']))} "
                f"| {ratio:.2f} | {ttft:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    peer = parser.add_mutually_exclusive_group(required=True)
    peer.add_argument("--peer-server", type=Path, help="a llama-server binary")
    peer.add_argument("--peer-python", help="a Python with xllamacpp")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--waves", type=int, default=2, help="requests = waves x concurrency")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ninfer-kernels", nargs="*", default=[], help="extra kernel sets")
    parser.add_argument(
        "--peer-omp-wait-policy",
        default="passive",
        help="OMP_WAIT_POLICY of the llama.cpp server (default: passive)",
    )
    args = parser.parse_args(argv)
    if args.threads != (os.cpu_count() or 1):
        parser.error("ninfer-serve uses every core; run with --threads equal to the core count")
    args.out.mkdir(parents=True, exist_ok=True)
    # A SIGTERM ends the comparison through the `finally` below, which stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers = start_servers(args, args.out)
    runs: list[dict[str, Any]] = []
    try:
        for name, (proc, port) in servers.items():
            print(f"{name}: ready in {wait_ready(proc, port, 600):.0f} s", flush=True)
        names = list(servers)
        load_before = load_average()
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for c in args.concurrency:
                for name in order:
                    path = args.out / f"{name}-c{c}-r{round_}.json"
                    # Fresh prompts for every round and level (the same for every server):
                    # both servers cache prefixes, and a repeated prompt would be a hit.
                    seed = 1000 * round_ + c
                    result = run_bench(servers[name][1], c, seed, args, path)
                    result.update(server=name, concurrency=c, round=round_)
                    runs.append(result)
                    print(
                        f"round {round_} c={c} {name}: {result['output_throughput']:.1f} tok/s, "
                        f"TTFT p50 {result['median_ttft_ms']:.0f} ms, load {load_average():.1f}",
                        flush=True,
                    )
        load_after = load_average()
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    system_info = peer_system_info(args)
    table = summarize(runs, names, args.concurrency)
    info = {
        "model": args.gguf.name,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "lanes": args.lanes,
        "threads": args.threads,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": load_after,
        "peer": f"llama-server {args.peer_server}" if args.peer_server else "xllamacpp wheel",
        "peer_system_info": system_info,
        "peer_omp_wait_policy": args.peer_omp_wait_policy,
    }
    text = to_markdown(table, args.concurrency, info)
    (args.out / "results_peer.json").write_text(
        json.dumps(
            {
                "info": info,
                "table": {k: {str(c): v for c, v in t.items()} for k, t in table.items()},
            },
            indent=2,
        )
        + "\n"
    )
    (args.out / "results_peer.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
