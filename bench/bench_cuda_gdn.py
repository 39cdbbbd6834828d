"""The gated delta rule on the GPU: recurrent against chunked, per layer, at the Qwen3.6 shapes.

For each shape (27B dense: 16 key / 48 value heads; 35B-A3B: 16 / 32; dk = dv = 128) and each
(lanes x tokens) prefill, the median device time of one layer's delta rule in both forms
(CudaHybridOps.time_gdn_core on seeded random inputs), the chunked form's two kernels apart
(chunk-parallel prepare, sequential scan), its tensor-core FLOPs and achieved rate, and the
whole model's share (x the GDN layers). A sweep over short single lanes locates the length
from which the chunked form wins (GdnForm::Auto's threshold, kGdnChunkedMinTokens).

    python bench/bench_cuda_gdn.py [--shapes qwen3.6-27b,qwen3.6-35b-a3b] [--reps 10]
"""

from __future__ import annotations

import argparse
import math

from ninfer import _core
from ninfer.convert.qwen3_5_presets import qwen3_5_preset

CHUNK = 64
PREFILLS = ((1, 8192), (1, 2048), (4, 2048))
SWEEP = ((1, 16), (1, 32), (1, 64), (1, 128), (1, 256), (1, 512), (16, 64), (16, 256))


def gdn_dims(shape: str) -> dict[str, int]:
    c = qwen3_5_preset(shape)["text_config"]
    interval = c["full_attention_interval"]
    return {
        "hk": c["linear_num_key_heads"],
        "hv": c["linear_num_value_heads"],
        "dk": c["linear_key_head_dim"],
        "dv": c["linear_value_head_dim"],
        "layers": c["num_hidden_layers"] - c["num_hidden_layers"] // interval,
    }


def chunked_flops(d: dict[str, int], lanes: int, tokens: int) -> float:
    """Multiply-adds x 2 of the chunked form as computed (full 64x64 K Kᵀ and Q Kᵀ tiles)."""
    c, dk, dv = CHUNK, d["dk"], d["dv"]
    prepare = 2 * (2 * c * c * dk) + 2 * (c * (c - 1) // 2) * (dk + dv)
    scan = 2 * (2 * c * dk * dv) + 2 * c * c * dv + 2 * dk * c * dv
    return float(lanes * math.ceil(tokens / c) * d["hv"] * (prepare + scan))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="qwen3.6-27b,qwen3.6-35b-a3b")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    ops = _core.CudaHybridOps(0)
    for shape in args.shapes.split(","):
        d = gdn_dims(shape)
        print(
            f"[{shape}] GDN: {d['hk']} key / {d['hv']} value heads, dk {d['dk']}, dv {d['dv']}, "
            f"{d['layers']} layers",
            flush=True,
        )
        cases = PREFILLS + (() if args.no_sweep else SWEEP)
        for lanes, tokens in cases:
            t = ops.time_gdn_core(lanes, tokens, d["hk"], d["hv"], d["dk"], d["dv"], args.reps)
            rec, chk = t["delta_rule"], t["delta_rule_chunked"]
            flops = chunked_flops(d, lanes, tokens)
            print(
                f"[{shape}] {lanes} x {tokens}: recurrent {rec:.3f} ms/layer, chunked {chk:.3f} "
                f"ms/layer (prepare {t['chunk_prepare']:.3f} + scan {t['chunk_scan']:.3f}), "
                f"speed-up {rec / chk:.2f}x; chunked {flops / 1e9:.1f} GFLOP at "
                f"{flops / (chk * 1e-3) / 1e12:.1f} TFLOP/s; x{d['layers']} layers: recurrent "
                f"{rec * d['layers']:.1f} ms, chunked {chk * d['layers']:.1f} ms; GDN core total "
                f"(Auto) {t['total']:.3f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
