"""Quantized decode steps as CUDA graphs against the same steps run eagerly, on the GPU alone.

usage: quant_graph_diag.py DTYPE [cpu]. For each switch setting (PDL on/off, the bf16 matmul
path auto/gemv) a quantized hybrid runs prefill + decode steps eagerly and then with graphs
(NINFER_CUDA_GRAPHS=1); prints the per-step max |graphs - eager| / max |logit| and the graph
replays, so a GPU session can tell which switch matters. With `cpu`, only builds the CPU
runner on the same artifact and runs its prefill (a crash there is then isolated).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


def steps(runner, ids, decode):
    got = [runner.forward(0, 0, ids, all_logits=True)]
    return got + [runner.forward(0, len(ids) + i, [t]) for i, t in enumerate(decode)]


def main() -> int:
    dtype = sys.argv[1]
    from ninfer import _core
    from ninfer.convert.random import make_random_artifact
    from test_cuda_quant_gemv import CONFIG, DECODE

    decode = DECODE + [7, 11, 13]
    ids = np.random.default_rng(3).integers(0, 512, size=40).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_random_artifact(
            CONFIG, Path(tmp) / "q.ninfer", dtype=dtype, tokenizer="synthetic"
        )
        print(f"{dtype}: artifact written", flush=True)
        if sys.argv[2:] == ["cpu"]:
            cpu = _core.ModelRunner(str(path), max_lanes=1, max_batch_tokens=64, threads=2)
            print(f"{dtype}: CPU runner built", flush=True)
            print(
                f"{dtype}: CPU prefill max {np.abs(steps(cpu, ids, [])[0]).max():.3f}", flush=True
            )
            return 0
        for pdl, matmul in (("1", "auto"), ("0", "auto"), ("1", "gemv")):
            os.environ["NINFER_CUDA_PDL"] = pdl
            if matmul == "auto":
                os.environ.pop("NINFER_CUDA_MATMUL", None)
            else:
                os.environ["NINFER_CUDA_MATMUL"] = matmul
            results = {}
            for graphs in ("0", "1"):
                os.environ["NINFER_CUDA_GRAPHS"] = graphs
                runner = _core.ModelRunner(
                    str(path), max_lanes=1, max_batch_tokens=64, device="cuda"
                )
                before = _core.cuda_graph_replays()
                results[graphs] = steps(runner, ids, decode)
                replays = _core.cuda_graph_replays() - before
                del runner
            scale = float(np.abs(results["0"][0]).max())
            diffs = [
                float(np.abs(g - e).max()) / scale
                for g, e in zip(results["1"], results["0"], strict=True)
            ]
            print(
                f"{dtype} pdl={pdl} matmul={matmul}: replays {replays}, |graphs-eager|/max "
                + " ".join(f"{d:.1e}" for d in diffs),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
