"""Host-tier benchmark of the prefix cache on the GPU machine (issue 13).

Two agent conversations take turns on one engine whose device KV pool holds only one of them
(--kv-capacity a little above one history), so each turn finds its own history evicted by the
other's. With a host tier (--host-mib) the evicted blocks and GDN snapshots were written to
host memory and the turn copies them back; without one (0) the turn recomputes its history.
Reported per turn: TTFT, cached tokens, and the bytes and seconds the host tier moved, so the
restore bandwidth (bytes / seconds of the copies themselves) and its share of the TTFT.

  python bench/bench_host_tier.py --out OUT [--shape qwen3.6-27b] [--history 32768]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_agent_loop import run_turn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402


def run(path: Path, args, host_mib: int, vocab: int) -> list[dict]:
    rng = np.random.default_rng(0)
    max_context = args.history + args.turns * (args.grow + args.answer) + 256
    options = _core.EngineOptions(
        max_concurrency=1,
        max_context=max_context,
        prefill_chunk=args.prefill_chunk,
        kv_capacity=max_context,  # one conversation, never both
        host_context_bytes=host_mib << 20,
    )
    engine = _core.Engine.open(
        str(path), options, [b""] * vocab, eos_ids=[], device=args.device, random_weights_seed=1
    )
    label = f"host {host_mib} MiB"
    histories = [rng.integers(0, vocab, size=args.history).tolist() for _ in range(2)]
    rows = []
    for turn in range(args.turns):
        for who in (0, 1):
            before = engine.stats()["host_tier"]
            out = run_turn(engine, histories[who], args.answer)
            after = engine.stats()["host_tier"]
            moved = after["restore_bytes"] - before["restore_bytes"]
            seconds = after["restore_seconds"] - before["restore_seconds"]
            row = {
                "turn": turn + 1,
                "conversation": "AB"[who],
                "prompt": len(histories[who]),
                "cached": out["cached"],
                "ttft_s": out["ttft_s"],
                "restore_bytes": moved,
                "restore_s": seconds,
                "restore_gb_s": moved / seconds / 1e9 if seconds > 0 else None,
            }
            rows.append(row)
            print(f"[{label}] turn {turn + 1}{'AB'[who]}: prompt {row['prompt']}, cached "
                  f"{row['cached']}, TTFT {row['ttft_s'] * 1000:.0f} ms, restored "
                  f"{moved / 1e9:.2f} GB in {seconds * 1000:.0f} ms", flush=True)  # fmt: skip
            histories[who] += out["tokens"] + rng.integers(0, vocab, size=args.grow).tolist()
    stats = engine.stats()
    engine.shutdown()
    rows.append({"host_tier": stats["host_tier"], "prefix_cache": stats["prefix_cache"]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="qwen3.6-27b")
    parser.add_argument("--history", type=int, default=32768)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--grow", type=int, default=1536)
    parser.add_argument("--answer", type=int, default=32)
    parser.add_argument("--prefill-chunk", type=int, default=4096)
    parser.add_argument("--host-mib", default="8192,0", help="host tier sizes to compare")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.turns < 2:
        parser.error("--turns must be at least 2: turn 1 plants, later turns measure")
    args.out.mkdir(parents=True, exist_ok=True)
    config = qwen3_5_preset(args.shape)
    vocab = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", config, None)
        for host_mib in (int(v) for v in args.host_mib.split(",")):
            t0 = time.perf_counter()
            results[host_mib] = run(path, args, host_mib, vocab)
            print(f"[host {host_mib} MiB] done in {time.perf_counter() - t0:.0f} s", flush=True)
    for host_mib, rows in results.items():
        later = [r for r in rows if "ttft_s" in r and r["turn"] > 1]
        rates = [r["restore_gb_s"] for r in later if r.get("restore_gb_s")]
        print(f"host {host_mib} MiB: median TTFT from turn 2 "
              f"{statistics.median(r['ttft_s'] for r in later) * 1000:.0f} ms"
              + (f", restore {statistics.median(rates):.1f} GB/s" if rates else ""))  # fmt: skip
    (args.out / "host_tier.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
