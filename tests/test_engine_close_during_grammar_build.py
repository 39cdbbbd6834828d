"""A start-up that fails while the grammar vocabulary still builds exits cleanly.

ninfer-serve builds the grammar vocabulary (seconds on the real 248k Qwen vocabulary) on a
background thread while it warms up. When the warm-up fails (out of device memory) or a
Ctrl+C interrupts start-up, the engine is closed and the interpreter exits; if the build was
still running in the core then, tearing the core down under it aborted the process
("terminate called without an active exception", status 134) instead of the clean exit 1.
The failure only shows at interpreter exit, so the scenario runs in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ninfer._core")

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from ninfer.convert.random import make_random_artifact
    from ninfer.engine import AsyncEngine
    from ninfer.engine_types import EngineConfig, EngineUnavailable

    HYBRID = {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
        "linear_value_head_dim": 16, "vocab_size": 248320, "mtp_num_hidden_layers": 0,
    }
    artifact = make_random_artifact(HYBRID, sys.argv[1], seed=1, name="hybrid")

    async def start() -> None:
        engine = AsyncEngine.open(str(artifact), EngineConfig(max_concurrency=1, max_context=256))
        build = engine.prepare_grammars()
        engine._core.inject_step_failures(50, out_of_memory=True)
        try:
            await engine.warmup(8, 2)
        finally:
            print("build running at close:", build.is_alive(), flush=True)
            await engine.close()

    try:
        asyncio.run(start())
    except EngineUnavailable as exc:
        print("start-up failed:", exc, flush=True)
        sys.exit(1)
    """
)


def test_a_failed_warm_up_during_the_grammar_build_exits_cleanly(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "hybrid.ninfer")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "start-up failed: warmup failed" in run.stdout, run.stdout + run.stderr
    assert "terminate called" not in run.stderr, run.stderr
    assert run.returncode == 1, run.stdout + run.stderr
