"""Cost of a speculative round against a plain decode step on the GPU, through the engine.

The real Qwen3.6 27B hybrid shape (seeded random bf16 weights made on the device from a
header-only artifact, MTP head included), batch 1, a --context-token prompt. Random weights make
the MTP head's acceptance meaningless, so two measurements split the cost:

- verification: a draft oracle proposes the recorded greedy continuation, so each round
  verifies k + 1 positions and records the GDN state per position; ms per round = decode
  time / decode rounds. (On random weights the logits are nearly flat over 248k tokens, so
  the verified rows, computed as one slice, round differently from single-token steps and
  the proposals are mostly rejected; that changes what a round commits, not what it costs.)
- MTP drafting: `--spec mtp` with k drafts (acceptance ~0 here), so each round also runs the
  MTP head k times (the full lm_head each time: no reduced proposal head yet).

Both against plain decode in the same engine (CUDA graphs on for plain steps; verification
rounds run eagerly). Floors: bytes a step must read / copy bandwidth (bench_cuda_hybrid.py's
step floor: weights, KV, GDN state read and written; a round adds k state-history writes, and
the MTP round adds the head's layer and k lm_head reads). The projection uses the published
per-position acceptance of MTP at 3 drafts on Qwen3.6-27B (0.85, 0.62, 0.46: mean accepted
length 2.93 with the bonus token, the issue's figures): tokens per round / round cost.

  python bench/bench_spec_cuda.py --out OUT [--k 3] [--context 1024] [--tokens 33]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import select
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset
from ninfer.convert.random import plan_random_artifact

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
from model_files import write_bf16_artifact  # noqa: E402

from bench_cuda import ceilings  # noqa: E402
from bench_cuda_hybrid import shape_counts  # noqa: E402

ACCEPTANCE = (0.85, 0.62, 0.46, 0.34, 0.25)  # per position; the first three are published


def mtp_params(cfg: dict) -> int:
    return sum(
        math.prod(shape)
        for name, (_, shape) in plan_random_artifact(cfg).tensors.items()
        if name.startswith("mtp.")
    )


def decode(engine, prompt: list[int], tokens: int, **kw) -> dict:
    before = engine.stats()
    result = engine.submit(prompt, tokens, temperature=0.0, ignore_eos=True, **kw)
    assert result.accepted, result
    out: list[int] = []
    while True:
        select.select([engine.event_fd], [], [], 5.0)
        for ev in engine.drain_events():
            if ev.request_id != result.request_id or ev.kind != "output":
                continue
            out += ev.token_ids
            if ev.finished:
                assert ev.finish_reason == "length", ev.error
                after = engine.stats()
                rounds = after["decode_rounds"] - before["decode_rounds"]
                return {
                    "tokens": out,
                    "decode_ms": ev.predicted_ms,
                    "rounds": rounds,
                    "ms_per_round": ev.predicted_ms / max(rounds, 1),
                    "drafted": after["spec_draft_tokens"] - before["spec_draft_tokens"],
                    "accepted": after["spec_accepted_tokens"] - before["spec_accepted_tokens"],
                }


def open_engine(path: Path, context: int, vocab: int, **spec) -> object:
    options = _core.EngineOptions(
        max_concurrency=1, max_context=context + 256, prefill_chunk=2048, kv_capacity=context + 512,
        **spec,
    )  # fmt: skip
    return _core.Engine.open(
        str(path), options, [b""] * vocab, eos_ids=[], device="cuda", random_weights_seed=1
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="qwen3.6-27b")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=33)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = qwen3_5_preset(args.shape)
    counts = shape_counts(cfg)
    bw = ceilings()["copy_bytes_per_s"]
    k = args.k
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, counts["vocab"], size=args.context).tolist()
    result: dict = {"shape": args.shape, "k": k, "context": args.context, "copy_bytes_per_s": bw}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bf16_artifact(Path(tmp) / "shape.ninfer", cfg, None)
        # Plain steps and oracle rounds: one engine with n-gram drafting that can never fire
        # (a 64-token suffix match cannot occur in a random prompt and a short answer).
        t0 = time.perf_counter()
        engine = open_engine(
            path, args.context, counts["vocab"], ngram_draft_tokens=k, ngram_min_match=64
        )
        print(f"engine up in {time.perf_counter() - t0:.1f} s", flush=True)
        decode(engine, prompt[:256], 8)  # warm-up (graph capture)
        plain = decode(engine, prompt, args.tokens)
        assert plain["drafted"] == 0, plain
        oracle = decode(engine, prompt, args.tokens, draft_oracle=plain["tokens"])
        engine.shutdown()
        del engine
        gc.collect()
        engine = open_engine(path, args.context, counts["vocab"], mtp_draft_tokens=k)
        decode(engine, prompt[:256], 8)
        mtp = decode(engine, prompt, args.tokens)
        engine.shutdown()
        del engine
        gc.collect()

    step_ms = plain["decode_ms"] / (args.tokens - 1)
    weights = 2.0 * counts["read_params"]
    kv = args.context * counts["kv_bytes_per_token"]
    state = counts["state_bytes_per_lane"]
    floor_step = (weights + kv + 2 * state) / bw
    floor_round = (weights + kv + (2 + k) * state) / bw
    head = 2.0 * mtp_params(cfg) + k * 2.0 * counts["vocab"] * counts["hidden"]
    floor_mtp_round = floor_round + head / bw
    per_round = 1 + sum(ACCEPTANCE[:k])
    rows = {
        "plain_step": {"ms": step_ms, "floor_ms": floor_step * 1e3},
        "verify_round": {"ms": oracle["ms_per_round"], "floor_ms": floor_round * 1e3,
                         "rounds": oracle["rounds"], "accepted": oracle["accepted"]},
        "mtp_round": {"ms": mtp["ms_per_round"], "floor_ms": floor_mtp_round * 1e3,
                      "rounds": mtp["rounds"], "drafted": mtp["drafted"],
                      "accepted": mtp["accepted"]},
    }  # fmt: skip
    for row in rows.values():
        row["floor_ratio"] = row["floor_ms"] / row["ms"]
        row["vs_plain_step"] = row["ms"] / step_ms
    result["rows"] = rows
    result["projection"] = {
        "acceptance": ACCEPTANCE[:k],
        "tokens_per_round": per_round,
        "plain_tok_s": 1e3 / step_ms,
        "mtp_tok_s": per_round * 1e3 / rows["mtp_round"]["ms"],
        "speedup": per_round / rows["mtp_round"]["vs_plain_step"],
        "speedup_verify_only": per_round / rows["verify_round"]["vs_plain_step"],
    }
    (args.out / "spec_bench.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
