"""Agent-loop benchmark of the prefix cache on the GPU machine (issue 13).

A simulated agent conversation through the engine's scheduler (submit, admission, prefix
lookup, chunked prefill, decode, publication; the server adds only HTTP framing and the
template): every turn resends the whole history, which starts at --start tokens and grows by
the previous answer plus --grow new "tool result" tokens. The same turns run twice on the
real Qwen3.6 27B hybrid shape (seeded random bf16 weights made on the device): with the
prefix cache and with --no-prefix-reuse. Reported per turn: TTFT (submit to first token),
cached tokens, and the hit ratio (cached / the history the previous turn forwarded).

  python bench/bench_agent_loop.py --out OUT [--shape qwen3.6-27b] [--turns 20]
"""

from __future__ import annotations

import argparse
import gc
import json
import select
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402


def run_turn(engine, prompt: list[int], answer: int) -> dict:
    t0 = time.perf_counter()
    result = engine.submit(prompt, answer, temperature=0.0, ignore_eos=True)
    assert result.accepted, result
    rid, first, tokens, cached = result.request_id, None, [], 0
    while True:
        select.select([engine.event_fd], [], [], 5.0)
        for ev in engine.drain_events():
            if ev.request_id != rid or ev.kind != "output":
                continue
            if ev.token_ids and first is None:
                first = time.perf_counter() - t0
            tokens += ev.token_ids
            cached = ev.cached_tokens
            if ev.finished:
                assert ev.finish_reason == "length", ev.error
                return {"ttft_s": first, "cached": cached, "tokens": tokens,
                        "total_s": time.perf_counter() - t0}  # fmt: skip


def run_loop(path: Path, args, reuse: bool, vocab: int, deadline: float) -> list[dict]:
    rng = np.random.default_rng(0)
    max_context = args.start + args.turns * (args.grow + args.answer) + 256
    options = _core.EngineOptions(
        max_concurrency=1,
        max_context=max_context,
        prefill_chunk=args.prefill_chunk,
        prefix_reuse=reuse,
        kv_capacity=0 if reuse else max_context,
        vram_headroom_mib=args.headroom_mib,
    )
    t0 = time.perf_counter()
    engine = _core.Engine.open(
        str(path),
        options,
        [b""] * vocab,
        eos_ids=[],
        device=args.device,
        random_weights_seed=-1 if args.artifact else 1,
    )
    label = "cache" if reuse else "no-reuse"
    print(f"[{label}] engine up in {time.perf_counter() - t0:.1f} s, "
          f"KV capacity {engine.kv_capacity} tokens", flush=True)  # fmt: skip
    history = rng.integers(0, vocab, size=args.start).tolist()
    rows, forwarded = [], 0
    for turn in range(args.turns):
        if time.monotonic() > deadline:
            print(f"[{label}] time budget spent after {turn} turns", flush=True)
            break
        out = run_turn(engine, history, args.answer)
        row = {
            "turn": turn + 1,
            "prompt": len(history),
            "cached": out["cached"],
            "ttft_s": out["ttft_s"],
            "hit_ratio": out["cached"] / forwarded if forwarded else None,
        }
        rows.append(row)
        print(f"[{label}] turn {turn + 1}: prompt {len(history)}, cached {out['cached']}, "
              f"TTFT {out['ttft_s'] * 1000:.0f} ms", flush=True)  # fmt: skip
        forwarded = len(history) + len(out["tokens"]) - 1  # the last token never ran
        history = history + out["tokens"] + rng.integers(0, vocab, size=args.grow).tolist()
    stats = engine.stats()
    engine.shutdown()
    del engine
    gc.collect()
    rows.append({"stats": stats["prefix_cache"], "pauses": stats["pauses"]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="qwen3.6-27b")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--start", type=int, default=8192)
    parser.add_argument("--grow", type=int, default=1536)
    parser.add_argument("--answer", type=int, default=32)
    parser.add_argument("--prefill-chunk", type=int, default=4096)
    parser.add_argument("--modes", default="cache,no-reuse")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--artifact", type=Path, help="a real artifact instead of the shape")
    parser.add_argument(
        "--headroom-mib", type=int, default=4096, help="auto KV sizing leaves this free"
    )
    parser.add_argument("--budget-s", type=float, default=1e9, help="start no turn after this")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"shape": args.shape, "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.artifact:
            path = args.artifact
            from ninfer.artifact import read_header

            vocab = int(read_header(path).header["config"]["vocab_size"])
        else:
            cfg = qwen3_5_preset(args.shape)
            vocab = int(cfg.get("vocab_size") or cfg["text_config"]["vocab_size"])
            path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        for mode in args.modes.split(","):
            deadline = time.monotonic() + args.budget_s
            result[mode] = run_loop(path, args, mode == "cache", vocab, deadline)
            (args.out / "agent_loop.json").write_text(json.dumps(result, indent=1))
    lines = ["| turn | prompt | cached | hit ratio | TTFT cache | TTFT no-reuse | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    cache = [r for r in result.get("cache", []) if "turn" in r]
    cold = [r for r in result.get("no-reuse", []) if "turn" in r]
    ratios = []
    for i, row in enumerate(cache):
        other = cold[i]["ttft_s"] if i < len(cold) else None
        ratio = row["ttft_s"] / other if other else None
        if ratio is not None and row["turn"] > 1:
            ratios.append(ratio)
        hit = f"{100 * row['hit_ratio']:.2f}%" if row["hit_ratio"] is not None else "-"
        lines.append(
            f"| {row['turn']} | {row['prompt']} | {row['cached']} | {hit} | "
            f"{row['ttft_s'] * 1000:.0f} ms | "
            + (f"{other * 1000:.0f} ms | {100 * ratio:.1f}% |" if other else "- | - |")
        )
    if ratios:
        lines.append(f"\nmedian TTFT ratio from turn 2: {100 * statistics.median(ratios):.1f}%")
    text = "\n".join(lines)
    (args.out / "agent_loop.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
