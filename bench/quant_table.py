"""Issue 14's benchmark table from one GPU call's results: every weight format and KV format of
the dense (bench_cuda_quant.py) and MoE (bench_cuda_moe_quant.py) runs, each point against its
floor, and beside it llama.cpp's llama-bench (bench/llama_peer.py) on the GGUF format of the
same width (FP8 against Q8_0, NVFP4 against Q4_K_M) where the peer ran that point on that shape
(decode b1 at a context it was given with -d, prefill 8192).

usage: python bench/quant_table.py --out TABLE.md [--quant results_quant.json]
           [--moe results_moe_quant.json] [--peer llama_peer.json ...]  (one per shape)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PEER_FORMAT = {"fp8": "q8_0", "nvfp4": "q4_k_m"}
PEER_NAME = {"q8_0": "Q8_0", "q4_k_m": "Q4_K_M"}


def peer_points(peers: list[dict[str, Any]]) -> dict[tuple[str, str, str, int], float]:
    """(shape, ftype, 'decode' | 'prefill', context or prompt) -> llama-bench tok/s."""
    points: dict[tuple[str, str, str, int], float] = {}
    for peer in peers:
        shape = peer["info"]["preset"]
        for row in peer.get("table", []):
            if row["test"].startswith("tg"):
                points[(shape, row["ftype"], "decode", int(row["depth"]))] = row["tok_s"]
            else:
                points[(shape, row["ftype"], "prefill", int(row["test"][2:]))] = row["tok_s"]
    return points


def model_rows(model: dict[str, Any], shape: str, points: dict) -> list[dict[str, Any]]:
    dtype, kv = model["dtype"], model.get("kv_dtype", "bf16")
    ftype = PEER_FORMAT.get(dtype)
    base = {"shape": shape, "weights": dtype, "kv": kv}
    peers = {key[1:]: value for key, value in points.items() if key[0] == shape}
    p = model["prefill"]
    rows = [
        base
        | {
            "point": "prefill 8192",
            "tok_s": p["tokens_per_s"],
            "floor_tok_s": p["floor_tokens_per_s"],
            "floor_kind": f"{p.get('floor_rate', 'bf16')} GEMM",
            "peer": peers.get((ftype, "prefill", 8192)) if ftype and kv == "bf16" else None,
        }
    ]
    for r in model["decode"]:
        peer = None
        if ftype and kv == "bf16" and r["batch"] == 1:  # the peer runs f16 KV, one sequence
            peer = peers.get((ftype, "decode", int(r["context"])))
        rows.append(
            base
            | {
                "point": f"decode b{r['batch']}, {r['context']} ctx",
                "tok_s": r["tokens_per_s"],
                "floor_tok_s": r["floor_tokens_per_s"],
                "floor_kind": "bytes",
                "peer": peer,
            }
        )
    return rows


def table_rows(quant: dict | None, moe: dict | None, peers: list[dict]) -> list[dict[str, Any]]:
    points = peer_points(peers)
    rows: list[dict[str, Any]] = []
    for model in (quant or {}).get("models", []):
        rows += model_rows(model, model["shape"], points)
    for model in (moe or {}).get("formats", []):
        rows += model_rows(model, "qwen3.6-35b-a3b", points)
    return rows


def to_markdown(rows: list[dict[str, Any]], peers: list[dict]) -> str:
    lines = [
        "| shape | weights | KV | point | tok/s | floor tok/s | of floor | llama.cpp "
        "| vs llama.cpp |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ftype = PEER_FORMAT.get(r["weights"], "")
        peer_cell = f"{r['peer']:.1f} ({PEER_NAME[ftype]})" if r["peer"] else ""
        ratio = f"{r['tok_s'] / r['peer']:.2f}×" if r["peer"] else ""
        lines.append(
            f"| {r['shape']} | {r['weights']} | {r['kv']} | {r['point']} | {r['tok_s']:.1f} | "
            f"{r['floor_tok_s']:.1f} ({r['floor_kind']}) | "
            f"{100 * r['tok_s'] / r['floor_tok_s']:.1f}% | {peer_cell} | {ratio} |"
        )
    for peer in peers:
        info = peer["info"]
        lines += [
            "",
            f"llama.cpp: llama-bench ({info['source']}, {info['build']}), -fa 1, f16 KV, "
            f"-r {info['reps']}, random GGUFs of the {info['preset']} shape ({info['layers']} "
            "layers); its own floors are in its llama_peer.md.",
        ]
    return "\n".join(lines) + "\n"


def load(path: Path | None) -> dict | None:
    return json.loads(path.read_text()) if path and path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quant", type=Path, default=None)
    parser.add_argument("--moe", type=Path, default=None)
    parser.add_argument("--peer", type=Path, nargs="*", default=[], help="llama_peer.json files")
    args = parser.parse_args(argv)
    peers = [p for p in (load(path) for path in args.peer) if p]
    text = to_markdown(table_rows(load(args.quant), load(args.moe), peers), peers)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
