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
    rows = quant_table.table_rows(quant, None, [PEER])
    by = {(r["weights"], r["kv"], r["point"]): r for r in rows}
    assert by[("fp8", "bf16", "decode b1, 1024 ctx")]["peer"] == 75.0
    assert by[("fp8", "bf16", "decode b1, 8192 ctx")]["peer"] == 74.0
    assert by[("fp8", "bf16", "prefill 8192")]["peer"] == 2800.0
    assert by[("fp8", "bf16", "decode b4, 1024 ctx")]["peer"] is None  # llama-bench: one sequence
    assert by[("fp8", "fp8", "decode b1, 1024 ctx")]["peer"] is None  # the peer ran f16 KV
    assert by[("nvfp4", "bf16", "decode b1, 1024 ctx")]["peer"] == 84.0
    assert by[("nvfp4", "bf16", "prefill 8192")]["peer"] is None  # no Q4_K_M prefill given
    text = quant_table.to_markdown(rows, [PEER])
    assert (
        "| qwen3.6-27b | fp8 | bf16 | decode b1, 1024 ctx | 90.0 | 150.0 (bytes) | 60.0% "
        "| 75.0 (Q8_0) | 1.20× |" in text
    )
    assert (
        "| qwen3.6-27b | nvfp4 | bf16 | decode b1, 1024 ctx | 84.0 | 150.0 (bytes) | 56.0% "
        "| 84.0 (Q4_K_M) | 1.00× |" in text
    )


def test_each_shape_meets_its_own_peer(tmp_path: Path):
    """The 35B-A3B rows take the peer run on the 35B-A3B GGUFs, never the 27B one's figures."""
    moe = {"formats": [model("fp8", "bf16", 250.0), model("fp8", "fp8", 240.0)]}
    peer_moe = {
        "info": dict(PEER["info"], preset="qwen3.6-35b-a3b", layers=40),
        "table": [{"ftype": "q8_0", "test": "tg128", "depth": 1024, "tok_s": 125.0}],
    }
    paths = {}
    for name, data in {"moe": moe, "peer27": PEER, "peer35": peer_moe}.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    out = tmp_path / "table.md"
    argv = ["--out", str(out), "--moe", str(paths["moe"])]
    argv += ["--peer", str(paths["peer27"]), str(paths["peer35"]), str(tmp_path / "absent.json")]
    assert quant_table.main(argv) == 0
    text = out.read_text()
    assert (
        "| qwen3.6-35b-a3b | fp8 | bf16 | decode b1, 1024 ctx | 250.0 | 150.0 (bytes) "
        "| 166.7% | 125.0 (Q8_0) | 2.00× |" in text
    )
    assert (
        "| qwen3.6-35b-a3b | fp8 | bf16 | decode b1, 8192 ctx | 80.0 | 145.0 (bytes) | 55.2% "
        "|  |  |" in text
    )
    assert "| qwen3.6-35b-a3b | fp8 | fp8 | decode b1, 1024 ctx | 240.0 |" in text
    assert "| 125.0 (Q8_0) | 1.92× |" not in text  # fp8 KV: no f16-KV peer figure beside it
    assert "qwen3.6-35b-a3b shape (40 layers)" in text and "-r 2" in text
