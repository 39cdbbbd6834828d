"""Prefill and decode speed of small Qwen3.5-style hybrid models (Gated DeltaNet + gated
attention, dense and MoE) on the CPU, at batch 1 and 4.

The artifacts are random bf16 weights (`ninfer.convert.random`) of a small config with the
real layout: 3 GDN layers per full-attention layer, GQA 4:1, DeltaNet value/key heads 2:1,
partial rotary 1/4. Batch 4 prefill runs four lanes' prompts in one plan per step; batch 4
decode advances four lanes by one token per step and counts all four tokens.

Run: PYTHONPATH=python python bench/bench_hybrid_cpu.py [--threads N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from ninfer import _core
from ninfer.convert.random import make_random_artifact

BASE = dict(
    vocab_size=4096, hidden_size=512, num_hidden_layers=8,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
    num_attention_heads=8, num_key_value_heads=2, head_dim=64, linear_num_key_heads=4,
    linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
    linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=False,
    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25),
)
CONFIGS = {
    "dense": dict(BASE, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text",
                  intermediate_size=1536),
    "moe": dict(BASE, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text",
                num_experts=16, num_experts_per_tok=4, moe_intermediate_size=384,
                shared_expert_intermediate_size=384),
}
PROMPT = 256


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def prompt(lane: int) -> list[int]:
    return np.random.default_rng(lane).integers(0, BASE["vocab_size"], PROMPT).tolist()


def prefill(runner, lanes: int) -> float:
    for lane in range(lanes):
        runner.reset(lane)
    start = time.perf_counter()
    runner.forward_batch([(lane, 0, prompt(lane)) for lane in range(lanes)])
    return lanes * PROMPT / (time.perf_counter() - start)


def decode(runner, lanes: int, steps: int) -> float:
    start = time.perf_counter()
    for i in range(steps):
        runner.forward_batch([(lane, PROMPT + i, [7 + lane]) for lane in range(lanes)])
    return lanes * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32, help="decode steps per round")
    args = parser.parse_args()
    print(f"{cpu_name()}, {os.cpu_count()} logical CPUs, threads={args.threads}, "
          f"kernels={_core.cpu_kernels()}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in CONFIGS.items():
            path = make_random_artifact(config, Path(tmp) / f"{name}.ninfer", seed=1,
                                        dtype="bf16", tokenizer="synthetic")
            runner = _core.ModelRunner(str(path), max_lanes=4, max_batch_tokens=4 * PROMPT,
                                       threads=args.threads, max_context=PROMPT + 4 * args.steps)
            info = runner.info
            print(f"{name}: {info['num_params'] / 1e6:.1f} M params, "
                  f"{info['weight_bytes'] / 1e6:.0f} MB {info['weight_format']}")
            for lanes in (1, 4):
                pre, dec = [], []
                for _ in range(args.rounds):
                    pre.append(prefill(runner, lanes))
                    dec.append(decode(runner, lanes, args.steps))
                print(f"  batch {lanes}: prefill({PROMPT}) {np.median(pre):8.1f} tok/s   "
                      f"decode {np.median(dec):7.1f} tok/s")


if __name__ == "__main__":
    main()
