"""Sampling on the device against today's host path, at the Qwen3.6 vocabulary (GPU machine).

For 1, 8 and 16 logit rows of 248,320 and a few sampling settings: the median time of
CudaBackend::sample_rows (upload of the rows, the kernel, download of the ids, one wait; a
device-side refresh of the logits before each call is subtracted), with each row on a cluster
of 8 blocks (the default at this vocabulary) and on a single block, against
today's per-step cost: copying every row's logits to pageable host memory plus the host
Sampler on each row (summed over rows; the engine spreads rows over up to 8 threads, so its
wall time is nearer copy + sum/min(rows, 8)). Logits are N(0, 2) with a few peaked tokens.
"""

from __future__ import annotations

import argparse

import numpy as np

from ninfer import _core

VOCAB = 248320
SETTINGS = {
    "greedy": {"temperature": 0.0},
    "T=1": {"temperature": 1.0},
    "T=0.7 top_p=0.9": {"temperature": 0.7, "top_p": 0.9},
    "T=1 top_k=20 top_p=0.95": {"temperature": 1.0, "top_k": 20, "top_p": 0.95},
    "T=0.6 top_p=0.95 +pen": {
        "temperature": 0.6, "top_p": 0.95, "presence_penalty": 0.5, "frequency_penalty": 0.2,
    },
}


def logits_for(rows: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.normal(0, 2, (rows, VOCAB)).astype(np.float32)
    for r in range(rows):
        x[r, rng.choice(VOCAB, 8, replace=False)] += rng.uniform(6, 12, 8).astype(np.float32)
    return x


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sampler = _core.CudaSampler(0)
    single = _core.CudaSampler(0, cluster_blocks=1)
    wide = _core.CudaSampler(0, cluster_blocks=16)  # non-portable: may not launch
    print(f"vocab {VOCAB}; medians of {args.iters} calls, ms")
    print("| rows | setting | device (8 blocks/row) | 1 block/row | 16 blocks/row | today: copy |"
          " today: host sample (sum) | today est. | speedup |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for rows in (1, 8, 16):
        logits = logits_for(rows, rng)
        for name, setting in SETTINGS.items():
            batch = []
            for _ in range(rows):
                row = dict(setting, uniform=float(rng.random()))
                if "presence_penalty" in setting:
                    tokens = rng.choice(VOCAB, 200)
                    row["penalties"] = {int(t): int(rng.integers(1, 4)) for t in tokens}
                batch.append(row)
            t = sampler.time(logits, batch, args.iters)
            one = single.time(logits, batch, args.iters, host_path=False)
            try:
                w = wide.time(logits, batch, args.iters, host_path=False)
                device_wide = f"{w['device_ms'] - w['refresh_ms']:.3f}"
            except RuntimeError as e:
                device_wide = f"n/a ({str(e)[:40]})"
            device = t["device_ms"] - t["refresh_ms"]
            device_one = one["device_ms"] - one["refresh_ms"]
            today = t["copy_ms"] + t["host_sample_ms"] / min(rows, 8)
            print(f"| {rows} | {name} | {device:.3f} | {device_one:.3f} | {device_wide} |"
                  f" {t['copy_ms']:.3f} |"
                  f" {t['host_sample_ms']:.3f} | {today:.3f} | {today / max(device, 1e-9):.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
