"""The issue-18 serving table: bench_serve.py result files beside the engine's own figures and
the hardware floors.

    python bench/serve_table.py ceilings --out DIR      # GPU: copy rate and bf16 GEMM rate
    python bench/serve_table.py table --out DIR         # DIR/serve/*.json -> results_serve.*

`tools/gpu/serve_table.sh` writes, per shape, `serve/<shape>.meta.json` (the config, the
server's lanes and prefill chunk, its start time) and one bench_serve.py result per run,
`serve/<shape>-in<N>-c<C>.json`. Each row of the table puts side by side, per run:

- the client's figures (vLLM definitions, bench/serve_metrics.py): output tok/s, TTFT, TPOT
  and ITL medians, ITL p99 / p50, and output tokens per text-carrying event (above 1 when
  the server held a token's text until the next one completed it, e.g. inside a UTF-8
  character: each such event is one ITL gap of two steps, not a stall);
- the engine's own account of the same requests (the `timings` object on the last chunk):
  prefill time and decode ms per token, and the ratio client ÷ engine of the decode rate;
- the floors: decode = the bytes one step reads (weights, as bench_cuda_hybrid.py counts them
  for the batch, plus the KV cache at the run's mean context and the GDN states) ÷ the copy
  rate measured in the same run; prefill = the prompt's FLOPs ÷ the bf16 GEMM rate.

Concurrency above the server's lanes (`--max-concurrency`, at most 8) queues: such a run's
TTFT includes the wait for a lane, and its decode batch is the lane count.

Each server's TTFT probe (`serve/<shape>-in<N>-ttft.json`: requests one at a time, 4 output
tokens) gets a table of its own: TTFT beside the engine's prefill of the same requests, and
their difference per request, which is the host's share (HTTP, template, tokenization,
admission, the first token's way out). The engine's prefill is its `prompt_ms`: from the
request getting a lane to the end of the step that computed the prompt's last chunk.

A server of quantized dummy weights (meta `dtype` fp8 / nvfp4) counts its decode floor with
every read parameter at that format's bytes (fp8 1, nvfp4 0.5625 with its scales): a floor,
since norms, embeddings and the expert stacks stay bf16.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def load_config(source: str) -> dict[str, Any]:
    """A preset name (qwen3.6-27b, ...) or a config.json path."""
    from ninfer.convert.qwen3_5_presets import preset_names, qwen3_5_preset

    if source.lower() in preset_names() and not Path(source).exists():
        return qwen3_5_preset(source)
    return json.loads(Path(source).read_text(encoding="utf-8"))


# Bytes a decode step reads per parameter, by the dummy weights' format.
PARAM_BYTES = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5625}


def floors(
    cfg: dict[str, Any],
    ceilings: dict[str, float] | None,
    batch: int,
    context: float,
    prompt: int,
    dtype: str = "bf16",
) -> dict[str, float | None]:
    """Per-stream decode floor (tok/s) at `batch` lanes of mean `context`, and the prefill floor
    (ms) of a `prompt`-token prompt; None without measured ceilings."""
    if not ceilings:
        return {"decode_floor_tok_s": None, "prefill_floor_ms": None}
    from bench_cuda_hybrid import prefill_flops, shape_counts

    counts = shape_counts(cfg, batch)
    step_bytes = (
        PARAM_BYTES.get(dtype, 2.0) * counts["read_params"]
        + batch * context * counts["kv_bytes_per_token"]
        + batch * 2 * counts["state_bytes_per_lane"]
    )
    step_s = step_bytes / ceilings["copy_bytes_per_s"]
    prefill_s = prefill_flops(shape_counts(cfg), prompt) / ceilings["bf16_gemm_flops"]
    return {"decode_floor_tok_s": 1.0 / step_s, "prefill_floor_ms": prefill_s * 1e3}


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def row(result: dict[str, Any], meta: dict[str, Any], cfg: dict[str, Any], ceilings: Any) -> dict:
    """One run's figures, client beside engine beside floor."""
    c = int(result["max_concurrency"] or result["num_prompts"])
    batch = min(c, int(meta["lanes"]))
    out_len = int(result["random_output_len"])
    served = result.get("total_served_prompt_tokens")
    prompt = round(served / result["completed"]) if served and result["completed"] else None
    prompt = prompt or int(result["random_input_len"])
    engine_tpot = result.get("median_server_tpot_ms")
    client_tpot = result["median_tpot_ms"]
    dtype = str(meta.get("dtype") or "bf16")
    floor = floors(cfg, ceilings, batch, prompt + out_len / 2, prompt, dtype)
    client_rate = 1e3 / client_tpot if client_tpot else None
    engine_rate = 1e3 / engine_tpot if engine_tpot else None
    events = sum(n for n in result.get("output_lens", []))
    itl_events = sum(len(g) + 1 for g in result.get("itls", []) if g)
    return {
        "input": int(result["random_input_len"]),
        "prompt_tokens": prompt,
        "concurrency": c,
        "batch": batch,
        "requests": result["completed"],
        "failed": result["failed"],
        "output_tok_s": result["output_throughput"],
        "ttft_ms": result["median_ttft_ms"],
        "ttft_p99_ms": result["p99_ttft_ms"],
        "engine_prefill_ms": result.get("median_server_prefill_ms"),
        "ttft_minus_prefill_ms": (
            result["median_ttft_ms"] - result["median_server_prefill_ms"]
            if "median_server_prefill_ms" in result
            else None
        ),
        "client_tpot_ms": client_tpot,
        "engine_tpot_ms": engine_tpot,
        "client_decode_tok_s": client_rate,
        "engine_decode_tok_s": engine_rate,
        "http_over_engine": _ratio(client_rate, engine_rate),
        "client_aggregate_tok_s": batch * client_rate if client_rate else None,
        "engine_aggregate_tok_s": batch * engine_rate if engine_rate else None,
        "itl_p50_ms": result["median_itl_ms"],
        "itl_p99_ms": result["p99_itl_ms"],
        "itl_p99_over_p50": _ratio(result["p99_itl_ms"], result["median_itl_ms"]),
        "tokens_per_event": _ratio(float(events), float(itl_events)) if itl_events else None,
        **floor,
        "client_over_floor": _ratio(client_rate, floor["decode_floor_tok_s"]),
    }


def probe_row(result: dict[str, Any]) -> dict[str, Any]:
    """A TTFT probe's figures: client TTFT and the engine's prefill, per request."""
    n = len(result["ttfts"])
    prompt_ms = result.get("server_prompt_ms") or [None] * n
    served = zip(result["ttfts"], result["output_lens"], prompt_ms, strict=True)
    done = [(1e3 * ttft, prefill) for ttft, out, prefill in served if out]
    ttfts = [ttft for ttft, _ in done]
    prefills = [prefill for _, prefill in done if prefill]
    host = [ttft - prefill for ttft, prefill in done if prefill]

    def median(values: list[float]) -> float | None:
        return float(np.median(values)) if values else None

    return {
        "input": int(result["random_input_len"]),
        "requests": result["completed"],
        "ttft_ms": median(ttfts),
        "ttft_min_ms": min(ttfts) if ttfts else None,
        "ttft_max_ms": max(ttfts) if ttfts else None,
        "engine_prefill_ms": median(prefills),
        "ttft_minus_prefill_ms": median(host),
        "ttft_minus_prefill_max_ms": max(host) if host else None,
    }


def _fmt(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and spec.endswith("%"):
        return f"{100 * value:.1f}%"
    return f"{value:{spec}}{suffix}"


def to_markdown(tables: list[dict[str, Any]], ceilings: dict[str, float] | None) -> str:
    lines = []
    if ceilings:
        lines += [
            f"Ceilings (same run): copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
            f"bf16 GEMM {ceilings['bf16_gemm_flops'] / 1e12:.0f} TFLOP/s.",
            "",
        ]
    for table in tables:
        meta = table["meta"]
        lines += [
            f"### {meta['shape']} ({meta.get('dtype', 'bf16')} dummy weights, lanes "
            f"{meta['lanes']}, prefill chunk {meta['prefill_chunk']}, "
            f"server ready in {meta.get('startup_s', 0):.0f} s)",
            "",
        ]
        if table.get("probes"):
            lines += [
                "TTFT probe (requests one at a time, 4 output tokens):",
                "",
                "| input | requests | TTFT p50 (min-max) | engine prefill p50 "
                "| TTFT − prefill p50 (max) |",
                "| ---: | ---: | ---: | ---: | ---: |",
            ]
            for p in table["probes"]:
                lines.append(
                    f"| {p['input']} | {p['requests']} | {_fmt(p['ttft_ms'])} "
                    f"({_fmt(p['ttft_min_ms'])}-{_fmt(p['ttft_max_ms'])}) ms "
                    f"| {_fmt(p['engine_prefill_ms'])} ms "
                    f"| {_fmt(p['ttft_minus_prefill_ms'])} "
                    f"({_fmt(p['ttft_minus_prefill_max_ms'])}) ms |"
                )
            lines.append("")
        lines += [
            "| input | c | batch | out tok/s | TTFT p50 | engine prefill | TTFT − prefill "
            "| prefill floor | TPOT p50 client / engine | decode tok/s client / engine "
            "| HTTP ÷ engine | aggregate client / engine | ITL p50 / p99 | p99 ÷ p50 "
            "| tokens / event | decode floor | client ÷ floor |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in table["rows"]:
            lines.append(
                f"| {r['input']} | {r['concurrency']} | {r['batch']} | {_fmt(r['output_tok_s'])} "
                f"| {_fmt(r['ttft_ms'], '.0f')} ms | {_fmt(r['engine_prefill_ms'], '.0f')} ms "
                f"| {_fmt(r['ttft_minus_prefill_ms'], '.1f')} ms "
                f"| {_fmt(r['prefill_floor_ms'], '.0f')} ms "
                f"| {_fmt(r['client_tpot_ms'], '.2f')} / {_fmt(r['engine_tpot_ms'], '.2f')} ms "
                f"| {_fmt(r['client_decode_tok_s'])} / {_fmt(r['engine_decode_tok_s'])} "
                f"| {_fmt(r['http_over_engine'], '%')} "
                f"| {_fmt(r['client_aggregate_tok_s'])} / {_fmt(r['engine_aggregate_tok_s'])} "
                f"| {_fmt(r['itl_p50_ms'], '.2f')} / {_fmt(r['itl_p99_ms'], '.2f')} ms "
                f"| {_fmt(r['itl_p99_over_p50'], '.2f')} "
                f"| {_fmt(r['tokens_per_event'], '.3f')} "
                f"| {_fmt(r['decode_floor_tok_s'])} | {_fmt(r['client_over_floor'], '%')} |"
            )
        if table.get("skipped"):
            lines += ["", "not run (time budget): " + ", ".join(table["skipped"])]
        lines.append("")
    return "\n".join(lines)


def build_tables(out: Path) -> tuple[list[dict[str, Any]], dict[str, float] | None]:
    serve = out / "serve"
    ceilings_path = out / "ceilings.json"
    ceilings = json.loads(ceilings_path.read_text()) if ceilings_path.exists() else None
    tables = []
    for meta_path in sorted(serve.glob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        cfg = load_config(meta["config"])
        rows = []
        for path in sorted(serve.glob(f"{meta['shape']}-in*-c*.json")):
            result = json.loads(path.read_text())
            if result.get("completed"):
                rows.append(row(result, meta, cfg, ceilings))
        rows.sort(key=lambda r: (r["input"], r["concurrency"]))
        probes = []
        for path in sorted(serve.glob(f"{meta['shape']}-in*-ttft.json")):
            result = json.loads(path.read_text())
            if result.get("completed"):
                probes.append(probe_row(result))
        probes.sort(key=lambda p: p["input"])
        tables.append(
            {"meta": meta, "rows": rows, "probes": probes, "skipped": meta.get("skipped", [])}
        )
    return tables, ceilings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["ceilings", "table"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "ceilings":
        from bench_cuda import ceilings

        (args.out / "ceilings.json").write_text(json.dumps(ceilings(), indent=2) + "\n")
        return 0
    tables, ceilings_ = build_tables(args.out)
    text = to_markdown(tables, ceilings_)
    (args.out / "results_serve.json").write_text(
        json.dumps({"ceilings": ceilings_, "tables": tables}, indent=2) + "\n"
    )
    (args.out / "results_serve.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
