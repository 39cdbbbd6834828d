"""Cost of output constraints: grammar compile time, CPU mask time per token, and decode
throughput with a JSON-schema constraint against unconstrained decoding.

Not a test: prints a summary and writes one JSON result. Two parts, both standalone (the
model is random weights from a header-only artifact, so no checkpoint is needed):

* `mask` (CPU only): the real Qwen3.5 248k vocabulary; the vocabulary build, compile time per
  schema (first compile and cache hit), then a random walk through each grammar timing
  `next_mask` (the CPU work the engine overlaps with the device step) and `accept`;
* `decode`: an engine on a model shape (default the Qwen3.6 27B shape; `--tiny` a small one for
  a CPU smoke run), B concurrent greedy requests of N tokens each, with a JSON-schema
  constraint that cannot close within N tokens and unconstrained with ignore_eos, at batch 1
  and 8. Reports aggregate decode tok/s and the constrained/unconstrained ratio.

    python bench/bench_constraints.py --parts mask --out /tmp/constraints.json
    python bench/bench_constraints.py --device cuda:0 --out "$OUT/constraints.json"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset
from ninfer.convert.random import make_random_artifact
from ninfer.engine import AsyncEngine
from ninfer.engine_types import EngineConfig, GenerationRequest, SamplingParams
from ninfer.protocols.constraints import ToolPolicy, lower_constraints
from ninfer.protocols.conversation import ToolDefinition

QWEN_VOCAB_ROWS = 248320
TINY = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=64,
    intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
    linear_value_head_dim=16, vocab_size=QWEN_VOCAB_ROWS, mtp_num_hidden_layers=0,
    layer_types=["linear_attention", "full_attention"],
)  # fmt: skip
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}
# Cannot close within the decode length, so every position is masked until max_tokens.
LONG_ARRAY = {
    "type": "object",
    "properties": {
        "values": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 999},
            "minItems": 4096,
        }
    },
    "required": ["values"],
    "additionalProperties": False,
}
WEATHER = ToolDefinition(
    name="get_weather",
    strict=True,
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)


def _grammars() -> dict[str, tuple[str, str]]:
    tools = lower_constraints(None, ToolPolicy(tools=[WEATHER], choice="required"))
    assert tools is not None
    return {
        "json_object": ("json_schema", '{"type":"object"}'),
        "person_schema": ("strict_json_schema", json.dumps(PERSON)),
        "long_array_schema": ("strict_json_schema", json.dumps(LONG_ARRAY)),
        "regex": ("regex", "(BUG|TASK)-[0-9]{4}: [a-z ]{1,60}"),
        "strict_tool_call": (tools.kind, tools.source),
    }


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def _tiny_engine(tmp: Path, device: str, lanes: int) -> AsyncEngine:
    path = make_random_artifact(TINY, tmp / "tiny.ninfer", seed=1, header_only=True, name="tiny")
    config = EngineConfig(device=device, max_concurrency=lanes, max_context=2048,
                          prefill_chunk=256, max_pending_requests=8,
                          random_weights_seed=1)  # fmt: skip
    return AsyncEngine.open(path, config)


def bench_mask(tmp: Path, steps: int) -> dict[str, Any]:
    """Compile and mask costs over the real Qwen vocabulary, without a model."""
    engine = _tiny_engine(tmp, "cpu", 1)
    vocab = int(engine.model_info["n_vocab"])
    vocabulary_s = engine._core.prepare_grammars()
    print(f"[mask] grammar vocabulary: {vocab} rows in {vocabulary_s:.2f} s", flush=True)
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"vocab_rows": vocab, "vocabulary_build_s": vocabulary_s, "grammars": {}}
    for name, (kind, source) in _grammars().items():
        first = engine.compile_constraint(kind, source)
        again = engine.compile_constraint(kind, source)
        matcher = _core.ConstraintMatcher(first, vocab)
        mask_s, accept_s = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            mask = matcher.next_mask()
            mask_s.append(time.perf_counter() - t0)
            bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab]
            allowed = np.flatnonzero(bits)
            if allowed.size == 0:
                break
            token = int(rng.choice(allowed))
            t0 = time.perf_counter()
            accepted = matcher.accept(token)
            accept_s.append(time.perf_counter() - t0)
            if not accepted or matcher.terminated:
                break
        row = {
            "compile_s": first.compile_seconds,
            "cache_hit_s": again.seconds,
            "cache_hit": again.cache,
            "positions": len(mask_s),
            "mask_us_median": 1e6 * statistics.median(mask_s),
            "mask_us_p90": 1e6 * _percentile(mask_s, 90),
            "accept_us_median": 1e6 * statistics.median(accept_s) if accept_s else 0.0,
            "mask_bytes_per_token": 4 * ((vocab + 31) // 32),
        }
        out["grammars"][name] = row
        print(
            f"[mask] {name}: compile {1000 * row['compile_s']:.1f} ms (hit "
            f"{1e6 * row['cache_hit_s']:.0f} us), mask {row['mask_us_median']:.0f} us median / "
            f"{row['mask_us_p90']:.0f} us p90 over {row['positions']} positions, accept "
            f"{row['accept_us_median']:.0f} us",
            flush=True,
        )
    asyncio.run(engine.close())
    return out


async def _decode_batch(engine: AsyncEngine, batch: int, tokens: int, constrained: bool) -> dict:
    grammar = None
    if constrained:
        grammar = engine.compile_constraint("strict_json_schema", json.dumps(LONG_ARRAY))
    rng = np.random.default_rng(batch)
    vocab = int(engine.model_info["n_vocab"])

    async def one(prompt: list[int]) -> Any:
        request = GenerationRequest(
            prompt_ids=prompt,
            max_tokens=tokens,
            sampling=SamplingParams(temperature=0.0),
            ignore_eos=not constrained,
            constraint=grammar,
        )
        async for event in engine.submit(request):
            if event.finished:
                assert event.finish_reason == "length", (event.finish_reason, event.error)
                return event
        raise RuntimeError("no final event")

    prompts = [rng.integers(0, min(vocab, 150000), size=32).tolist() for _ in range(batch)]
    t0 = time.perf_counter()
    finals = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    decode_s = max(f.timings.predicted_ms for f in finals) / 1000.0
    decoded = sum(f.completion_tokens - 1 for f in finals)
    row: dict[str, Any] = {"wall_s": wall, "decode_tokens_per_s": decoded / decode_s}
    if constrained:
        stats = [f.constraint for f in finals]
        positions = sum(s["mask_positions"] for s in stats)
        row["mask_us_per_position"] = 1e6 * sum(s["mask_seconds"] for s in stats) / positions
        row["matcher_us_per_position"] = 1e6 * sum(s["matcher_seconds"] for s in stats) / positions
    return row


def bench_decode(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    lanes = max(args.batches)
    if args.tiny:
        engine = _tiny_engine(tmp, args.device, lanes)
        shape = "tiny"
    else:
        shape = args.shape
        path = make_random_artifact(qwen3_5_preset(shape), tmp / "shape.ninfer", seed=1,
                                    header_only=True, name=shape)  # fmt: skip
        config = EngineConfig(device=args.device, max_concurrency=lanes, max_context=2048,
                              prefill_chunk=512, max_pending_requests=8, random_weights_seed=1,
                              kv_capacity=lanes * 2048)  # fmt: skip
        engine = AsyncEngine.open(path, config)
    engine.prepare_grammars().join()
    asyncio.run(_decode_batch(engine, 1, 8, constrained=True))  # warm-up, both routes
    asyncio.run(_decode_batch(engine, 1, 8, constrained=False))
    out: dict[str, Any] = {"shape": shape, "device": args.device, "tokens": args.tokens}
    for batch in args.batches:
        free = asyncio.run(_decode_batch(engine, batch, args.tokens, constrained=False))
        held = asyncio.run(_decode_batch(engine, batch, args.tokens, constrained=True))
        ratio = held["decode_tokens_per_s"] / free["decode_tokens_per_s"]
        out[f"batch_{batch}"] = {"unconstrained": free, "json_schema": held, "ratio": ratio}
        print(
            f"[decode] {shape} batch {batch}: unconstrained {free['decode_tokens_per_s']:.1f} "
            f"tok/s, JSON schema {held['decode_tokens_per_s']:.1f} tok/s ({100 * ratio:.1f} %), "
            f"mask {held['mask_us_per_position']:.0f} us/position",
            flush=True,
        )
    asyncio.run(engine.close())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON result file")
    parser.add_argument("--parts", default="mask,decode", help="mask, decode or both")
    parser.add_argument("--device", default="cuda:0", help="decode part: cpu or cuda:N")
    parser.add_argument("--shape", default="qwen3.6-27b", help="decode part: a model preset")
    parser.add_argument("--tiny", action="store_true", help="decode part: a tiny model instead")
    parser.add_argument("--tokens", type=int, default=128, help="decode part: tokens per request")
    parser.add_argument("--batches", default="1,8", help="decode part: concurrent requests")
    parser.add_argument("--steps", type=int, default=200, help="mask part: positions per grammar")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    parts = args.parts.split(",")
    result: dict[str, Any] = {
        "machine": platform.node(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        if "mask" in parts:
            result["mask"] = bench_mask(Path(tmp), args.steps)
        if "decode" in parts:
            result["decode"] = bench_decode(Path(tmp), args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
