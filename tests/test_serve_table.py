"""bench/serve_table.py on synthetic bench_serve.py results: a throughput point, a TTFT probe
and a quantized server's table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import serve_table  # noqa: E402

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2}


def _point(input_len: int, c: int) -> dict:
    return {
        "max_concurrency": c,
        "num_prompts": c,
        "random_input_len": input_len,
        "random_output_len": 512,
        "total_served_prompt_tokens": input_len * c,
        "completed": c,
        "failed": 0,
        "output_throughput": 100.0 * c,
        "median_ttft_ms": 150.0,
        "p99_ttft_ms": 160.0,
        "median_server_prefill_ms": 140.0,
        "median_tpot_ms": 10.0,
        "median_server_tpot_ms": 9.8,
        "median_itl_ms": 10.0,
        "p99_itl_ms": 12.0,
        "output_lens": [512] * c,
        "itls": [[0.01] * 511] * c,
    }


def _probe(input_len: int) -> dict:
    return {
        "random_input_len": input_len,
        "completed": 3,
        "ttfts": [0.760, 0.750, 0.0],  # the third request failed
        "output_lens": [4, 4, 0],
        "server_prompt_ms": [748.0, 742.0, None],
    }


def test_tables_with_probe_and_quantized_server(tmp_path):
    serve = tmp_path / "serve"
    serve.mkdir()
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(CONFIG))
    for name, dtype in (("tiny", "bf16"), ("tiny-fp8", "fp8")):
        meta = {"shape": name, "config": str(config), "dtype": dtype, "lanes": 8}
        meta |= {"prefill_chunk": 1024, "startup_s": 6, "skipped": ["in 8192 c 16"]}
        (serve / f"{name}.meta.json").write_text(json.dumps(meta))
        (serve / f"{name}-in1024-c4.json").write_text(json.dumps(_point(1024, 4)))
        (serve / f"{name}-in8192-ttft.json").write_text(json.dumps(_probe(8192)))
    tables, ceilings = serve_table.build_tables(tmp_path)
    assert ceilings is None
    by_name = {t["meta"]["shape"]: t for t in tables}
    assert set(by_name) == {"tiny", "tiny-fp8"}  # the bf16 glob does not take fp8's files
    probe = by_name["tiny"]["probes"][0]
    assert probe["requests"] == 3 and probe["input"] == 8192
    assert abs(probe["ttft_ms"] - 755.0) < 1e-6  # the two that produced output
    assert abs(probe["ttft_minus_prefill_ms"] - 10.0) < 1e-6  # median of 12 and 8
    assert probe["ttft_max_ms"] == 760.0
    row = by_name["tiny"]["rows"][0]
    assert row["concurrency"] == 4 and abs(row["ttft_minus_prefill_ms"] - 10.0) < 1e-9
    text = serve_table.to_markdown(tables, None)
    assert "### tiny-fp8 (fp8 dummy weights" in text and "TTFT probe" in text
    assert "not run (time budget): in 8192 c 16" in text


def test_quantized_floor_reads_fewer_bytes():
    cfg = serve_table.load_config("qwen3.6-27b")
    ceilings = {"copy_bytes_per_s": 4.0e12, "bf16_gemm_flops": 8.0e14}
    bf16 = serve_table.floors(cfg, ceilings, 1, 1024, 1024)["decode_floor_tok_s"]
    fp8 = serve_table.floors(cfg, ceilings, 1, 1024, 1024, "fp8")["decode_floor_tok_s"]
    assert bf16 and fp8 and 1.5 < fp8 / bf16 < 2.0  # the KV and GDN state reads stay
