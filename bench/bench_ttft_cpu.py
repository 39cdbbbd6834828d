"""Where a long prompt's TTFT goes besides the prefill, on the CPU and without a real model.

Serves a tiny Qwen3.5-shaped header-only artifact with the real Qwen tokenizer and template
(`ninfer-serve --load-format dummy`, so the prefill itself is short and the host work shows),
sends `--requests` streamed chat requests of about `--input-len` prompt tokens one at a time
(distinct random words: no prefix-cache hits), and splits each TTFT with the server's request
log (`--request-log-jsonl`):

- prepare: arrival of the request -> engine submit (body parse, template, tokenization);
- queue: submit -> lane (the engine's queue_wait);
- prefill: lane -> the step that computed the prompt's last chunk finished (the engine's
  prompt_ms, the figure the GPU table puts beside TTFT as "engine prefill");
- to python: prefill end -> the first token's event read on the server's event loop
  (first-token sampling, the core's event queue, the asyncio bridge);
- wire: the rest of the client's TTFT (ASGI before arrival, rendering and writing the first
  content frame, the client reading it).

    PYTHONPATH=python python bench/bench_ttft_cpu.py --input-len 8192 --requests 8

The first request is dropped (template compilation, first-use allocations).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from bench_serve import WORDS  # noqa: E402

TINY_QWEN = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 16,
    "vocab_size": 248320,
    "mtp_num_hidden_layers": 0,
    "max_position_embeddings": 65536,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_artifact(directory: Path) -> Path:
    from ninfer.convert.cli import main as convert_main

    config = directory / "tiny-qwen.json"
    config.write_text(json.dumps(TINY_QWEN))
    out = directory / "tiny-qwen.ninfer"
    argv = ["--random", str(config), "--header-only", "--name", "tiny-qwen", "-o", str(out), "-q"]
    if convert_main(argv) != 0:
        raise SystemExit("could not write the header-only artifact")
    return out


def start_server(artifact: Path, log: Path, port: int, max_context: int) -> subprocess.Popen:
    command_tail = [
        "-m",
        "ninfer.server",
        str(artifact),
        "--load-format",
        "dummy",
        "--port",
        str(port),
        "--max-context",
        str(max_context),
        "--request-log-jsonl",
        str(log),
        "--log-stats-interval-ms",
        "0",
    ]
    command = [sys.executable, *command_tail]
    if profile := os.environ.get("BENCH_TTFT_PYSPY"):  # py-spy raw stacks of the server
        command = ["py-spy", "record", "--native", "-r", "1000", "-f", "raw", "-o", profile, "--"]
        command += [sys.executable, *command_tail]
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent / "python")}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_ready(client: httpx.Client, server: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"server exited: {server.stderr.read().decode()[-2000:]}")
        try:
            if client.get("/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit("server did not become ready")


def one_request(client: httpx.Client, words: int, rng: random.Random) -> float:
    """Client TTFT in seconds: send -> the first event with content."""
    body = {
        "model": "tiny-qwen",
        "messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=words))}],
        "max_tokens": 2,
        "temperature": 0,  # greedy, as bench_serve.py and the GPU table sample
        "ignore_eos": True,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    start = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line.removeprefix("data: ")).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):  # not the role chunk
                    first = time.perf_counter()
    if first is None:
        raise SystemExit("no content event in the stream")
    return first - start


def breakdown(records: list[dict[str, Any]], client_ttfts: list[float]) -> dict[str, float]:
    parts: dict[str, list[float]] = {k: [] for k in ("prepare", "queue", "prefill", "to_python")}
    parts["wire"], parts["client_ttft"], parts["prompt_tokens"] = [], [], []
    for record, client in zip(records, client_ttfts, strict=True):
        t = record["timings_seconds"]
        queue = record["engine_timing"]["queue_wait_seconds"]
        parts["prepare"].append(t["prepare"])
        parts["queue"].append(queue)
        parts["prefill"].append(t["prefill"])
        parts["to_python"].append(t["ttft"] - t["prepare"] - queue - t["prefill"])
        parts["wire"].append(client - t["ttft"])
        parts["client_ttft"].append(client)
        parts["prompt_tokens"].append(record["result"]["prompt_tokens"])
    return {k: statistics.median(v) for k, v in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-len", type=int, default=8192, help="prompt words (≈ tokens)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--artifact", type=Path, help="a header-only artifact (default: tiny)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        artifact = args.artifact or make_artifact(directory)
        log = directory / "requests.jsonl"
        port = free_port()
        server = start_server(artifact, log, port, args.input_len + 512)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                wait_ready(client, server)
                rng = random.Random(args.seed)
                words = args.input_len - 20  # the template adds a few tokens
                ttfts = [one_request(client, words, rng) for _ in range(args.requests)]
        finally:
            # py-spy writes its profile on SIGINT, the server stops on either.
            profiling = bool(os.environ.get("BENCH_TTFT_PYSPY"))
            server.send_signal(signal.SIGINT if profiling else signal.SIGTERM)
            server.wait(60)
        records = [json.loads(line) for line in log.read_text().splitlines()]
        records = [r for r in records if r.get("event") == "request_done"]
        if os.environ.get("BENCH_TTFT_DUMP"):
            print(json.dumps(records[-1], indent=1))
    medians = breakdown(records[1:], ttfts[1:])
    if os.environ.get("BENCH_TTFT_DUMP"):
        print("prepare ms", [round(1e3 * r["timings_seconds"]["prepare"], 1) for r in records])
    print(f"{args.requests - 1} requests of ~{medians.pop('prompt_tokens'):.0f} prompt tokens")
    for name, value in medians.items():
        print(f"  {name:<12} {1e3 * value:8.2f} ms (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
