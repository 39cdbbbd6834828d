"""Do bench_serve.py and a maintained client agree? The same load through both, alternating.

Runs `bench/bench_serve.py` and GuideLLM (`pip install guidellm`, its `guidellm run` with a
generated scenario: synthetic prompts, fixed output length, a fixed number of concurrent
streams) against one running server, at each concurrency, `--rounds` times each in
alternation, and prints their figures side by side:

- output tok/s: all output tokens over the run's wall time (both clients);
- TTFT: median over requests;
- time per output token after the first: vLLM's TPOT, (E2EL - TTFT) / (tokens - 1) averaged
  over requests, against GuideLLM's inter-token latency, the same per-request quantity;
- prompt tokens the server counted per request (from the server's usage in bench_serve's
  result file; GuideLLM's own count), so that a difference in the chat template's share shows;
- the server's own time per output token over the same run, from its `/metrics` before and
  after: (Σ request duration − Σ TTFT) ÷ output tokens after each request's first. A client
  that reads the stream late shows as its figure above the server's; a client that slows the
  server (CPU taken from it) moves both.

    python bench/bench_guidellm_agreement.py --base-url http://127.0.0.1:8080 \\
        --tokenizer /path/to/hf-tokenizer-dir --random-input-len 256 --random-output-len 128 \\
        --concurrency 1,4 --num-prompts 8 --rounds 2 --result-file agree.json

GuideLLM needs a Hugging Face tokenizer for its synthetic prompts: `--tokenizer` is a folder
with a tokenizer.json, a tokenizer.json, or the served .ninfer artifact (its own tokenizer, so
a header-only artifact of a preset works too); bench_serve.py uses the server's /tokenize.
`--guidellm` is the command, split as a shell would (e.g. `env PYTHONPATH=/tmp/gl python3 -m
guidellm` where GuideLLM lives in its own package folder).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# /metrics series whose change over a run gives the server's own time per output token.
SERVER_SERIES = (
    "ninfer_request_duration_seconds_sum",
    "ninfer_time_to_first_token_seconds_sum",
    "ninfer_decode_tokens_total",
)


def hf_tokenizer_folder(source: Path, folder: Path) -> Path:
    """A folder transformers.AutoTokenizer loads: `source` itself when it is one, else a
    folder made in `folder` from a tokenizer.json or from a .ninfer artifact's resource."""
    if source.is_dir():
        return source
    if source.suffix == ".json":
        data = source.read_bytes()
    else:
        from ninfer.artifact.reader import read_header

        data = read_header(source).resource("tokenizer.json")
    target = folder / "hf_tokenizer"
    target.mkdir(parents=True, exist_ok=True)
    (target / "tokenizer.json").write_bytes(data)
    # Without a config AutoTokenizer cannot tell which class reads the file.
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def metric_values(text: str) -> dict[str, float]:
    """SERVER_SERIES from a Prometheus text page, each summed over its label sets."""
    values = dict.fromkeys(SERVER_SERIES, 0.0)
    for line in text.splitlines():
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)", line)
        if match and match.group(1) in values:
            values[match.group(1)] += float(match.group(2))
    return values


def server_tpot_ms(before: dict[str, float], after: dict[str, float]) -> float:
    """The server's own (duration - TTFT) / (tokens - 1) over the requests between two pages."""
    delta = {name: after[name] - before[name] for name in SERVER_SERIES}
    tokens = delta["ninfer_decode_tokens_total"]
    if tokens <= 0:
        return float("nan")
    decode_s = (
        delta["ninfer_request_duration_seconds_sum"]
        - delta["ninfer_time_to_first_token_seconds_sum"]
    )
    return 1e3 * decode_s / tokens


def read_metrics(base_url: str) -> dict[str, float]:
    import httpx

    return metric_values(httpx.get(f"{base_url}/metrics", timeout=30).text)


def with_server_account(base_url: str, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """`run`'s figures plus the server's own time per output token over it."""
    before = read_metrics(base_url)
    figures = run()
    return figures | {"server_tpot_ms": server_tpot_ms(before, read_metrics(base_url))}


def guidellm_scenario(
    base_url: str,
    model: str,
    tokenizer: str,
    input_len: int,
    output_len: int,
    streams: int,
    requests: int,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ninfer-agreement-c{streams}",
            "description": "bench_guidellm_agreement.py",
        },
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": base_url,
                "model": model,
                "request_format": "/v1/chat/completions",
            },
            "tokenizer": {"kind": "hf_auto", "model": tokenizer},
            "profile": {"kind": "concurrent", "streams": streams},
            "data": [
                {"kind": "synthetic_text", "prompt_tokens": input_len, "output_tokens": output_len}
            ],
            "constraints": [{"kind": "max_requests", "count": requests}],
        },
    }


def guidellm_figures(report: dict[str, Any]) -> dict[str, float]:
    """The compared figures of a GuideLLM JSON report's first benchmark."""
    bench = report["benchmarks"][0]
    metrics = bench["metrics"]

    def ok(name: str) -> dict[str, Any]:
        return metrics[name]["successful"]

    return {
        "output_tok_s": ok("output_token_count")["total_sum"] / bench["duration"],
        "median_ttft_ms": ok("time_to_first_token_ms")["median"],
        "mean_tpot_ms": ok("inter_token_latency_ms")["mean"],
        "prompt_tokens": ok("prompt_token_count")["mean"],
        "completed": ok("output_token_count")["count"],
    }


def bench_serve_figures(result: dict[str, Any]) -> dict[str, float]:
    """The compared figures of a bench_serve.py result file."""
    completed = result["completed"]
    return {
        "output_tok_s": result["output_throughput"],
        "median_ttft_ms": result["median_ttft_ms"],
        "mean_tpot_ms": result["mean_tpot_ms"],
        "prompt_tokens": result["total_served_prompt_tokens"] / completed
        if completed
        else float("nan"),
        "completed": completed,
    }


def run_bench_serve(args: argparse.Namespace, streams: int, out: Path) -> dict[str, float]:
    command = [
        sys.executable,
        str(HERE / "bench_serve.py"),
        "--base-url",
        args.base_url,
        "--random-input-len",
        str(args.random_input_len),
        "--random-output-len",
        str(args.random_output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--max-concurrency",
        str(streams),
        "--result-file",
        str(out),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return bench_serve_figures(json.loads(out.read_text()))


def run_guidellm(
    args: argparse.Namespace, model: str, streams: int, folder: Path
) -> dict[str, float]:
    scenario = folder / f"scenario_c{streams}.json"
    report = folder / f"guidellm_c{streams}.json"
    scenario.write_text(
        json.dumps(
            guidellm_scenario(
                args.base_url,
                model,
                str(args.hf_tokenizer),
                args.random_input_len,
                args.random_output_len,
                streams,
                args.num_prompts,
            )
        )
    )
    command = [
        *shlex.split(args.guidellm),
        "run",
        "-c",
        str(scenario),
        "--output",
        f"kind=json,path={report}",
        "--disable-console",
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=folder)
    return guidellm_figures(json.loads(report.read_text()))


def served_model(base_url: str) -> str:
    import httpx

    return httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]["id"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", required=True)
    parser.add_argument(
        "--tokenizer",
        type=Path,
        required=True,
        help="for GuideLLM: a Hugging Face tokenizer folder, a tokenizer.json or the .ninfer",
    )
    parser.add_argument("--random-input-len", type=int, default=256)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--guidellm", default="guidellm", help="the guidellm command")
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args()
    model = served_model(args.base_url)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        args.hf_tokenizer = hf_tokenizer_folder(args.tokenizer, folder)
        for streams in (int(c) for c in args.concurrency.split(",")):
            runs: dict[str, list[dict[str, float]]] = {"bench_serve": [], "guidellm": []}
            for _ in range(args.rounds):
                runs["bench_serve"].append(
                    with_server_account(
                        args.base_url,
                        partial(run_bench_serve, args, streams, folder / "bench_serve.json"),
                    )
                )
                runs["guidellm"].append(
                    with_server_account(
                        args.base_url, partial(run_guidellm, args, model, streams, folder)
                    )
                )
            for client, figures in runs.items():
                keys = figures[0].keys()
                rows.append(
                    {"client": client, "concurrency": streams}
                    | {k: statistics.median(f[k] for f in figures) for k in keys}
                )
    print(
        f"{args.random_input_len} prompt tokens / {args.random_output_len} output, "
        f"{args.num_prompts} requests a run, median of {args.rounds} runs a client"
    )
    print(
        "| c | client | output tok/s | TTFT p50 (ms) | time per output token (ms) "
        "| server's own (ms) | prompt tokens |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['client']} | {r['output_tok_s']:.1f} "
            f"| {r['median_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} "
            f"| {r['server_tpot_ms']:.2f} | {r['prompt_tokens']:.0f} |"
        )
    if args.result_file:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        settings |= {"result_file": None, "hf_tokenizer": None}
        args.result_file.write_text(json.dumps({"args": settings, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
