"""End-to-end serving benchmark: what a client of a running server measures over HTTP.

Drives any server with streaming OpenAI Chat Completions (default), legacy Completions,
OpenAI Responses or Anthropic Messages (`--endpoint`) using random prompts of an exact token
length and `ignore_eos` outputs of a fixed length, at a fixed concurrency (`--max-concurrency`)
and/or a Poisson arrival rate (`--request-rate`). The flags are `vllm bench serve`'s
spellings, so its command lines carry over:

    ninfer-serve --max-concurrency 4 &
    python bench/bench_serve.py --base-url http://127.0.0.1:8080 --random-input-len 1024 \\
        --random-output-len 128 --num-prompts 32 --max-concurrency 4 --result-file out.json

Metrics (request throughput, output tok/s, TTFT, TPOT, ITL, E2EL with mean / median / std /
percentiles) are defined as vLLM defines them; see bench/serve_metrics.py for the exact
definitions. Differences from vLLM's client: prompts are words drawn at random from a fixed
English list and cut to exactly `--random-input-len` tokens with the server's own
`/tokenize` and `/detokenize` (or `--tokenizer tokenizer.json`), rather than random token
ids; `--ignore-eos` is on by default (`--no-ignore-eos` turns it off); the default
percentiles are 50, 90 and 99 and E2EL is reported too. TTFT ends at the first event that
carries output text, not at an earlier role-only chunk. Before the clock starts, the client
opens one connection per concurrent request (a GET /v1/models each), so TTFT holds no
connection setup.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_endpoints import ENDPOINTS, Endpoint, GenerationOptions  # noqa: E402
from serve_metrics import (  # noqa: E402
    PERCENTILE_METRICS,
    RequestRecord,
    compute_metrics,
    per_request_fields,
    percentile_key,
    poisson_intervals,
)

# Common English words, nearly all one token (with their leading space) in BPE vocabularies.
WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be "
    "has had or not but have first one their its new after who they been also two her time "
    "more other into year over city only most some three world part can when there used can "
    "state during many people may under school found known team between years high where "
    "well both through since about these made later such four while before being place then "
    "house line work each name left area could life called number final would water must "
    "early long group small great river book north south west east music light field game "
    "play road point story power money market table window garden paper morning open stone"
).split()


# --- tokenizers: exact prompt lengths -------------------------------------------------------


class ServerTokenizer:
    """The server's /tokenize and /detokenize (vLLM / NInfer shape, or llama.cpp's)."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def encode(self, text: str) -> list[int]:
        # Both spellings: `prompt` (vLLM, NInfer) and `content` (llama.cpp).
        body = {"prompt": text, "add_special_tokens": False, "content": text, "add_special": False}
        r = self._client.post("/tokenize", json=body)
        r.raise_for_status()
        return list(r.json()["tokens"])

    def decode(self, ids: list[int]) -> str:
        r = self._client.post("/detokenize", json={"tokens": ids})
        r.raise_for_status()
        body = r.json()
        return body["prompt"] if "prompt" in body else body["content"]


class FileTokenizer:
    """A Hugging Face tokenizer.json, read with the `tokenizers` package."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        source = Path(path)
        self._tokenizer = Tokenizer.from_file(
            str(source / "tokenizer.json" if source.is_dir() else source)
        )

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)


def exact_length_text(tokenizer: Any, rng: np.random.Generator, length: int) -> tuple[str, int]:
    """Random words cut to `length` tokens: (text, its token count, `length` unless the
    tokenizer does not round-trip a cut)."""
    if length <= 0:
        return "", 0
    ids: list[int] = []
    while len(ids) < length:
        ids += tokenizer.encode(" " + " ".join(rng.choice(WORDS, size=length + 8)))
    ids = ids[:length]
    text, count = "", 0
    for _ in range(5):
        text = tokenizer.decode(ids).lstrip()
        count = len(tokenizer.encode(text))
        if count == length:
            break
        if count > length:
            ids = ids[: len(ids) - (count - length)]
        else:
            more = tokenizer.encode(" " + " ".join(rng.choice(WORDS, size=length - count)))
            ids = ids + more[: length - count]
    return text, count


def sample_requests(tokenizer: Any, args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(prompt, input tokens, output tokens) per request, reproducible from --seed."""
    rng = np.random.default_rng(args.seed)
    ratio = args.random_range_ratio

    def lengths(mean: int) -> np.ndarray:
        low, high = int(mean * (1 - ratio)), int(mean * (1 + ratio))
        return rng.integers(low, high + 1, size=args.num_prompts)

    input_lens, output_lens = lengths(args.random_input_len), lengths(args.random_output_len)
    prefix, prefix_len = exact_length_text(tokenizer, rng, args.random_prefix_len)
    out = []
    for n_in, n_out in zip(input_lens, output_lens, strict=True):
        body, body_len = exact_length_text(tokenizer, rng, int(n_in))
        text = f"{prefix} {body}" if prefix else body
        out.append((text, prefix_len + body_len, max(1, int(n_out))))
    return out


# --- the client ---------------------------------------------------------------------------


def _headers(endpoint: Endpoint) -> dict[str, str]:
    headers = dict(endpoint.headers)
    key = os.environ.get("OPENAI_API_KEY") or os.environ.get("ANTHROPIC_API_KEY")
    if key:
        headers["authorization"] = f"Bearer {key}"
        headers["x-api-key"] = key
    return headers


async def send_request(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    body: dict[str, Any],
    record: RequestRecord,
) -> None:
    """One streamed request; fills `record`. Events that arrive in one read share its
    arrival time (they did arrive together)."""
    headers = _headers(endpoint)
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", endpoint.path, json=body, headers=headers) as r:
            if r.status_code != 200:
                record.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return
            pending = b""
            async for chunk in r.aiter_bytes():
                now = time.perf_counter()
                pending += chunk.replace(b"\r\n", b"\n")
                *events, pending = pending.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        update = endpoint.parse(json.loads(data))
                        if update.error:
                            record.error = update.error
                            return
                        if update.text:
                            if record.output_events == 0:
                                record.ttft = now - start
                            else:
                                record.itl.append(now - last)
                            last = now
                            record.output_events += 1
                        if update.output_tokens is not None:
                            record.output_tokens = update.output_tokens
                        if update.prompt_tokens is not None:
                            record.served_prompt_tokens = update.prompt_tokens
                        if update.server_prompt_ms is not None:
                            record.server_prompt_ms = update.server_prompt_ms
                        if update.server_decode_ms_per_token is not None:
                            record.server_tpot_ms = update.server_decode_ms_per_token
        record.latency = time.perf_counter() - start
        record.success = record.output_events > 0
        if not record.success:
            record.error = "the stream ended without output"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"


async def open_connections(client: httpx.AsyncClient, count: int) -> None:
    """Open `count` pooled connections (one concurrent GET /v1/models each) before the clock
    starts, so that no measured request pays for a TCP connect or the client's first-use
    costs (about 250 ms for a fresh httpx client on a loaded 2-CPU machine)."""
    responses = await asyncio.gather(*(client.get("/v1/models") for _ in range(count)))
    for r in responses:
        r.raise_for_status()


async def run_benchmark(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    requests: Sequence[tuple[str, int, int]],
    args: argparse.Namespace,
    model: str,
) -> tuple[list[RequestRecord], float]:
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    extra = json.loads(args.extra_body) if args.extra_body else {}

    async def one(prompt: str, prompt_len: int, output_len: int) -> RequestRecord:
        options = GenerationOptions(model, output_len, args.ignore_eos, args.temperature)
        record = RequestRecord(prompt_len=prompt_len)
        body = {**endpoint.body(prompt, options), **extra}
        if limit is None:
            await send_request(client, endpoint, body, record)
        else:
            async with limit:
                await send_request(client, endpoint, body, record)
        return record

    if args.num_warmups:
        warm = [one(*requests[i % len(requests)]) for i in range(args.num_warmups)]
        for record in await asyncio.gather(*warm):
            if not record.success:
                raise RuntimeError(f"warm-up request failed: {record.error}")
    await open_connections(client, min(args.max_concurrency or len(requests), len(requests)))
    gaps = poisson_intervals(len(requests), args.request_rate, args.burstiness, args.seed)
    start = time.perf_counter()
    tasks = []
    for request, gap in zip(requests, gaps, strict=True):
        tasks.append(asyncio.create_task(one(*request)))
        if gap > 0:
            await asyncio.sleep(gap)
    records = list(await asyncio.gather(*tasks))
    return records, time.perf_counter() - start


# --- command line -------------------------------------------------------------------------


def _percentiles(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values or any(not 0 < p < 100 for p in values):
        raise argparse.ArgumentTypeError("percentiles must lie strictly between 0 and 100")
    return values


def _metric_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PERCENTILE_METRICS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(PERCENTILE_METRICS)}"
        )
    return names


def _positive_rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("--request-rate must be positive (inf = all at once)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_serve.py",
        description="Benchmark a running server over streaming HTTP (vllm bench serve flags).",
    )
    add = parser.add_argument
    add("--base-url", help="server root, e.g. http://127.0.0.1:8080 (default: from --host/--port)")
    add("--host", default="127.0.0.1", help="server host when --base-url is not given")
    add("--port", type=int, default=8080, help="server port when --base-url is not given")
    add(
        "--endpoint",
        default="/v1/chat/completions",
        choices=sorted(ENDPOINTS),
        help="API route; its wire format is chosen by it (default: /v1/chat/completions)",
    )
    add(
        "--backend",
        default="openai-chat",
        help="accepted for vLLM command lines; the wire format follows --endpoint",
    )
    add("--model", help="model id to send (default: the first of GET /v1/models)")
    add(
        "--tokenizer",
        help="tokenizer.json (or a folder with one) for exact prompt lengths "
        "(default: the server's /tokenize and /detokenize)",
    )
    add("--dataset-name", default="random", choices=["random"], help="prompt source (random)")
    add("--random-input-len", type=int, default=1024, help="prompt tokens (default: 1024)")
    add("--random-output-len", type=int, default=128, help="output tokens (default: 128)")
    add(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths drawn uniformly from [len*(1-r), len*(1+r)] (default: 0)",
    )
    add(
        "--random-prefix-len",
        type=int,
        default=0,
        help="tokens of one random prefix shared by every prompt (default: 0)",
    )
    add("--num-prompts", type=int, default=100, help="requests to send (default: 100)")
    add(
        "--max-concurrency",
        type=int,
        default=None,
        help="requests in flight at most (default: unbounded)",
    )
    add(
        "--request-rate",
        type=_positive_rate,
        default=float("inf"),
        help="requests per second, Poisson arrivals; inf sends all at once (default: inf)",
    )
    add(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the arrival gaps; 1 = Poisson (default: 1)",
    )
    add("--seed", type=int, default=0, help="seed of prompts and arrivals (default: 0)")
    add(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask the server to run every output to its length (default: on)",
    )
    add(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature sent with each request (default: 0, greedy)",
    )
    add("--extra-body", help="JSON object merged into every request body")
    add(
        "--num-warmups",
        type=int,
        default=0,
        help="unmeasured requests sent before the run (default: 0)",
    )
    add(
        "--percentile-metrics",
        type=_metric_names,
        default=list(PERCENTILE_METRICS),
        help="metrics to report percentiles of (default: ttft,tpot,itl,e2el)",
    )
    add(
        "--metric-percentiles",
        type=_percentiles,
        default=[50.0, 90.0, 99.0],
        help="comma-separated percentiles (default: 50,90,99)",
    )
    add("--result-file", help="write the summary and per-request data here as JSON")
    add("--save-result", action="store_true", help="vLLM style: save into --result-dir")
    add("--result-dir", default=".", help="folder for --save-result (default: .)")
    add("--result-filename", help="file name for --save-result (default: generated)")
    add(
        "--ready-check-timeout-sec",
        type=int,
        default=600,
        help="wait this long for the server to answer /v1/models (default: 600)",
    )
    add("--disable-tqdm", action="store_true", help="accepted for vLLM command lines")
    return parser


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.num_prompts < 1:
        parser.error("--num-prompts must be at least 1")
    if args.random_input_len < 1 or args.random_output_len < 1 or args.random_prefix_len < 0:
        parser.error("--random-input-len and --random-output-len must be at least 1")
    if not 0 <= args.random_range_ratio < 1:
        parser.error("--random-range-ratio must lie in [0, 1)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.error("--max-concurrency must be at least 1")
    if args.burstiness <= 0:
        parser.error("--burstiness must be positive")
    if args.extra_body is not None:
        try:
            if not isinstance(json.loads(args.extra_body), dict):
                raise ValueError
        except ValueError:
            parser.error("--extra-body must be a JSON object")


def wait_until_ready(client: httpx.Client, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = client.get("/v1/models")
            if r.status_code == 200:
                return r.json()
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not answer /v1/models within {timeout_s} s")
        time.sleep(0.5)


def format_report(result: dict[str, Any], args: argparse.Namespace) -> str:
    titles = {
        "ttft": "Time to First Token",
        "tpot": "Time per Output Token (excl. 1st token)",
        "itl": "Inter-token Latency",
        "e2el": "End-to-end Latency",
    }
    lines = [
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        f"{'Successful requests:':<40}{result['completed']:<10}",
        f"{'Failed requests:':<40}{result['failed']:<10}",
        f"{'Maximum request concurrency:':<40}{str(args.max_concurrency):<10}",
        f"{'Request rate (req/s):':<40}{args.request_rate:<10}",
        f"{'Benchmark duration (s):':<40}{result['duration']:<10.2f}",
        f"{'Total input tokens:':<40}{result['total_input_tokens']:<10}",
        f"{'Total generated tokens:':<40}{result['total_output_tokens']:<10}",
        f"{'Request throughput (req/s):':<40}{result['request_throughput']:<10.2f}",
        f"{'Output token throughput (tok/s):':<40}{result['output_throughput']:<10.2f}",
        f"{'Total Token throughput (tok/s):':<40}{result['total_token_throughput']:<10.2f}",
    ]
    for name in args.percentile_metrics:
        lines.append("{s:{c}^{n}}".format(s=titles[name], n=50, c="-"))
        label = name.upper()
        lines.append(f"{'Mean ' + label + ' (ms):':<40}{result[f'mean_{name}_ms']:<10.2f}")
        lines.append(f"{'Median ' + label + ' (ms):':<40}{result[f'median_{name}_ms']:<10.2f}")
        for p in args.metric_percentiles:
            key = percentile_key(p)
            lines.append(
                f"{key.upper() + ' ' + label + ' (ms):':<40}{result[f'{key}_{name}_ms']:<10.2f}"
            )
    if "median_server_tpot_ms" in result or "median_server_prefill_ms" in result:
        lines.append("{s:{c}^{n}}".format(s="Server-reported (engine clock)", n=50, c="-"))
        for name, label in (("server_prefill", "prefill"), ("server_tpot", "TPOT")):
            if f"median_{name}_ms" in result:
                value = result[f"median_{name}_ms"]
                lines.append(f"{'Median server ' + label + ' (ms):':<40}{value:<10.2f}")
    lines.append("=" * 50)
    return "\n".join(lines)


def _result_path(args: argparse.Namespace, stamp: str) -> Path | None:
    if args.result_file:
        return Path(args.result_file)
    if args.save_result:
        name = args.result_filename or (
            f"bench-serve-{args.request_rate}qps-concurrency{args.max_concurrency}-{stamp}.json"
        )
        return Path(args.result_dir) / name
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(args, parser)
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    endpoint = ENDPOINTS[args.endpoint]
    if args.ignore_eos and not endpoint.ignore_eos:
        print(
            f"note: {args.endpoint} has no ignore_eos field, so outputs may end before "
            f"--random-output-len (pass a server's own field with --extra-body)",
            file=sys.stderr,
        )
    with httpx.Client(base_url=base_url, timeout=60) as client:
        models = wait_until_ready(client, args.ready_check_timeout_sec)
        model = args.model or models["data"][0]["id"]
        tokenizer = FileTokenizer(args.tokenizer) if args.tokenizer else ServerTokenizer(client)
        requests = sample_requests(tokenizer, args)
    print(
        f"{len(requests)} prompts of {args.random_input_len} tokens, outputs of "
        f"{args.random_output_len}, {args.endpoint} on {base_url} ({model})",
        file=sys.stderr,
    )

    async def drive() -> tuple[list[RequestRecord], float]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        timeout = httpx.Timeout(6 * 3600.0, connect=60.0)
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as c:
            return await run_benchmark(c, endpoint, requests, args, model)

    records, duration = asyncio.run(drive())
    summary = compute_metrics(
        records, duration, percentiles=args.metric_percentiles, metrics=args.percentile_metrics
    )
    print(format_report(summary, args))
    for error in sorted({r.error for r in records if r.error})[:5]:
        print(f"error: {error}", file=sys.stderr)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = _result_path(args, stamp)
    if path is not None:
        served = [r.served_prompt_tokens for r in records if r.served_prompt_tokens is not None]
        result = {
            "date": stamp,
            "backend": args.backend,
            "endpoint": args.endpoint,
            "base_url": base_url,
            "model_id": model,
            "num_prompts": args.num_prompts,
            "random_input_len": args.random_input_len,
            "random_output_len": args.random_output_len,
            "max_concurrency": args.max_concurrency,
            "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
            "burstiness": args.burstiness,
            "ignore_eos": args.ignore_eos,
            "total_served_prompt_tokens": sum(served) if served else None,
            **summary,
            **per_request_fields(records),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    return 0 if summary["completed"] == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
