"""bench/quant_table.py: issue 14's table joins NInfer's quantized runs with llama-bench's on the
right format, point and KV, and computes each ratio from the figures it was given."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import quant_table  # noqa: E402


def model(dtype: str, kv: str, b1_1k: float) -> dict:
    return {
        "shape": "qwen3.6-27b",
        "dtype": dtype,
        "kv_dtype": kv,
        "prefill": {"tokens_per_s": 14000.0, "floor_tokens_per_s": 24000.0, "floor_rate": "fp8"},
        "decode": [
            {"context": 1024, "batch": 1, "tokens_per_s": b1_1k, "floor_tokens_per_s": 150.0},
            {"context": 1024, "batch": 4, "tokens_per_s": 300.0, "floor_tokens_per_s": 600.0},
            {"context": 8192, "batch": 1, "tokens_per_s": 80.0, "floor_tokens_per_s": 145.0},
        ],
    }


PEER = {
    "info": {
        "source": "llama.cpp x",
        "build": "CUDA",
        "reps": 2,
        "preset": "qwen3.6-27b",
        "layers": 64,
    },
    "table": [
        {"ftype": "q8_0", "test": "tg128", "depth": 1024, "tok_s": 75.0},
        {"ftype": "q8_0", "test": "tg128", "depth": 8192, "tok_s": 74.0},
        {"ftype": "q8_0", "test": "pp8192", "depth": 0, "tok_s": 2800.0},
        {"ftype": "q4_k_m", "test": "tg128", "depth": 1024, "tok_s": 84.0},
    ],
}


def test_peer_matched_by_format_point_and_kv():
    quant = {
        "models": [
            model("fp8", "bf16", 90.0),
            model("fp8", "fp8", 88.0),
            model("nvfp4", "bf16", 84.0),
        ]
    }
    rows = quant_table.table_rows(quant, None, PEER)
    by = {(r["weights"], r["kv"], r["point"]): r for r in rows}
    assert by[("fp8", "bf16", "decode b1, 1024 ctx")]["peer"] == 75.0
    assert by[("fp8", "bf16", "decode b1, 8192 ctx")]["peer"] == 74.0
    assert by[("fp8", "bf16", "prefill 8192")]["peer"] == 2800.0
    assert by[("fp8", "bf16", "decode b4, 1024 ctx")]["peer"] is None  # llama-bench: one sequence
    assert by[("fp8", "fp8", "decode b1, 1024 ctx")]["peer"] is None  # the peer ran f16 KV
    assert by[("nvfp4", "bf16", "decode b1, 1024 ctx")]["peer"] == 84.0
    assert by[("nvfp4", "bf16", "prefill 8192")]["peer"] is None  # no Q4_K_M prefill given
    text = quant_table.to_markdown(rows, PEER)
    assert (
        "| qwen3.6-27b | fp8 | bf16 | decode b1, 1024 ctx | 90.0 | 150.0 (bytes) | 60.0% "
        "| 75.0 (Q8_0) | 1.20× |" in text
    )
    assert (
        "| qwen3.6-27b | nvfp4 | bf16 | decode b1, 1024 ctx | 84.0 | 150.0 (bytes) | 56.0% "
        "| 84.0 (Q4_K_M) | 1.00× |" in text
    )


def test_moe_rows_and_files(tmp_path: Path):
    moe = {"formats": [dict(model("fp8", "fp8", 250.0), shape=None)]}
    (tmp_path / "moe.json").write_text(json.dumps(moe))
    (tmp_path / "peer.json").write_text(json.dumps(PEER))
    out = tmp_path / "table.md"
    assert (
        quant_table.main(
            [
                "--out",
                str(out),
                "--moe",
                str(tmp_path / "moe.json"),
                "--peer",
                str(tmp_path / "peer.json"),
            ]
        )
        == 0
    )
    text = out.read_text()
    assert (
        "| qwen3.6-35b-a3b | fp8 | fp8 | decode b1, 1024 ctx | 250.0 | 150.0 (bytes) "
        "| 166.7% |  |  |" in text
    )
    assert "-r 2" in text
