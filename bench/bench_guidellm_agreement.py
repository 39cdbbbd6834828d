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
  result file; GuideLLM's own count), so that a difference in the chat template's share shows.

    python bench/bench_guidellm_agreement.py --base-url http://127.0.0.1:8080 \\
        --tokenizer /path/to/hf-tokenizer-dir --random-input-len 256 --random-output-len 128 \\
        --concurrency 1,4 --num-prompts 8 --rounds 2 --result-file agree.json

GuideLLM needs a Hugging Face tokenizer (a folder with tokenizer.json) for its synthetic
prompts; bench_serve.py uses the server's /tokenize.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


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
                args.tokenizer,
                args.random_input_len,
                args.random_output_len,
                streams,
                args.num_prompts,
            )
        )
    )
    command = [
        args.guidellm,
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
        "--tokenizer", required=True, help="a Hugging Face tokenizer folder (for GuideLLM)"
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
        for streams in (int(c) for c in args.concurrency.split(",")):
            runs: dict[str, list[dict[str, float]]] = {"bench_serve": [], "guidellm": []}
            for _ in range(args.rounds):
                runs["bench_serve"].append(
                    run_bench_serve(args, streams, folder / "bench_serve.json")
                )
                runs["guidellm"].append(run_guidellm(args, model, streams, folder))
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
        "| c | client | output tok/s | TTFT p50 (ms) | time per output token (ms) | prompt tokens |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['client']} | {r['output_tok_s']:.1f} "
            f"| {r['median_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} | {r['prompt_tokens']:.0f} |"
        )
    if args.result_file:
        args.result_file.write_text(
            json.dumps({"args": vars(args) | {"result_file": None}, "rows": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
