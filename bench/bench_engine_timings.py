"""The server's engine without HTTP: the `timings` ninfer-serve reports, and token gaps.

Opens a header-only artifact the way `ninfer-serve --load-format dummy` does (AsyncEngine,
seeded random weights on the device, the serve table's lanes / prefill chunk / context) and
runs, one request at a time, the sequence tools/gpu/serve_table.sh sends: a warm-up of one
short request per lane at once, prompts of --probe-lens with 4 output tokens, then long
outputs at --long-lens. Per request it prints the engine's own prefill (`prompt_ms`: lane to
the end of the step that computed the prompt's last chunk), decode ms per token
(`predicted_ms` / (n - 1)) and the gaps between output events as the asyncio side receives
them (p50 / p99 / the largest, with the token index where each of the largest happened).

The same script runs on older trees (it uses only AsyncEngine, EngineConfig and
GenerationRequest as they were on 2026-12-01), so two builds measured in one GPU call say
whether a change of the served figures is the engine's. Prompts are random token ids
(seeded), not the serve table's words: the same lengths, not the same text.

    python bench/bench_engine_timings.py ARTIFACT --device cuda:0 --result-file out.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.engine import AsyncEngine
from ninfer.engine_types import EngineConfig, GenerationRequest


def gap_summary(gaps: list[float], top: int = 8) -> dict[str, Any]:
    """p50 / p99 of the gaps (ms, numpy's linear percentiles as bench_serve uses), and the
    largest ones with the index of the output event that ended them."""
    if not gaps:
        return {}
    ms = np.asarray(gaps) * 1e3
    order = np.argsort(ms)[::-1][:top]
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    return {
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "p99_over_p50": round(p99 / p50, 3) if p50 > 0 else None,
        "largest": [[int(i) + 1, round(float(ms[i]), 2)] for i in order],
        # Every gap over 1.3 x p50 (issue 18's bound), in order: where the tail sits in the
        # stream (regular token indices point at the engine, scattered ones at the host).
        "over_1_3x_p50": [
            [int(i) + 1, round(float(g), 2)] for i, g in enumerate(ms) if g > 1.3 * p50
        ],
    }


async def one(engine: AsyncEngine, prompt: list[int], output: int) -> dict[str, Any]:
    request = GenerationRequest(prompt_ids=prompt, max_tokens=output, ignore_eos=True)
    started = time.perf_counter()
    handle = engine.submit(request)
    arrivals: list[float] = []
    final = None
    async for event in handle:
        now = time.perf_counter()
        if event.token_ids:
            arrivals.append(now)
        if event.finished:
            final = event
    timings = final.timings if final is not None else None
    tokens = len(arrivals)
    result: dict[str, Any] = {
        "prompt": len(prompt),
        "events": tokens,
        "first_event_ms": round((arrivals[0] - started) * 1e3, 2) if arrivals else None,
    }
    if timings is not None:
        result["prompt_ms"] = round(timings.prompt_ms, 2)
        result["queue_ms"] = round(timings.queue_ms, 2)
        if output > 1:
            result["decode_ms_per_token"] = round(timings.predicted_ms / max(output - 1, 1), 3)
    result["gaps"] = gap_summary([b - a for a, b in zip(arrivals, arrivals[1:], strict=False)])
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = EngineConfig(
        max_concurrency=args.lanes,
        max_context=args.max_context,
        prefill_chunk=args.prefill_chunk,
        max_pending_requests=64,
        device=args.device,
        random_weights_seed=args.seed,
    )
    t0 = time.perf_counter()
    engine = AsyncEngine.open(args.artifact, config)
    await engine.warmup()
    out: dict[str, Any] = {"load_s": round(time.perf_counter() - t0, 2), "runs": []}
    vocab = int(engine.model_info["n_vocab"])
    rng = np.random.default_rng(args.seed)

    def prompt(length: int) -> list[int]:
        # Clear of both ends (the added tokens sit at the top), so no special token is sent.
        margin = min(1000, vocab // 8)
        return rng.integers(margin, vocab - margin, size=length).tolist()

    # The serve table's warm-up: one short request per lane at once.
    await asyncio.gather(*(one(engine, prompt(32), 16) for _ in range(args.lanes)))
    if args.gc_freeze:
        gc.collect()
        gc.freeze()

    def log(label: str, r: dict[str, Any]) -> None:
        r["label"] = label
        out["runs"].append(r)
        gaps = r.get("gaps") or {}
        print(
            f"{label}: prompt {r['prompt']} prefill {r.get('prompt_ms')} ms, decode "
            f"{r.get('decode_ms_per_token')} ms/token, gaps p50 {gaps.get('p50_ms')} p99 "
            f"{gaps.get('p99_ms')} ({gaps.get('p99_over_p50')}x), largest "
            f"{gaps.get('largest', [])[:4]}",
            flush=True,
        )

    for spec in args.probe_lens.split():
        length, count = (int(x) for x in spec.split(":"))
        for i in range(count):
            log(f"probe {length} #{i + 1}", await one(engine, prompt(length), 4))
    for spec in args.long_lens.split():
        length, output = (int(x) for x in spec.split(":"))
        log(f"long {length} out {output}", await one(engine, prompt(length), output))
    await engine.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--prefill-chunk", type=int, default=1024)
    parser.add_argument("--max-context", type=int, default=8960)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--probe-lens", default="8192:3 1024:3", help="input:requests, 4 out")
    parser.add_argument("--long-lens", default="1024:512 8192:256", help="input:output")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after the warm-up, as ninfer-serve"
    )
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.result_file:
        args.result_file.write_text(json.dumps(result) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
