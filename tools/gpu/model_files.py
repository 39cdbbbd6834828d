"""Artifacts for the GPU tests and benchmarks, written straight from arrays.

`write_bf16_artifact` stores given float32 tensors as bf16 (so a reference model holding the
same rounded weights computes the same function), or only the header when `tensors` is None
(for `ModelRunner(..., random_weights_seed=...)`, whose weights are made on the device).
Dense (Llama/Qwen2/Qwen3) and hybrid (Qwen3.5/3.6 dense and MoE) configs both work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact import ArtifactWriter, f32_to_bf16_bits
from ninfer.convert.random import plan_random_artifact


def write_bf16_artifact(
    path: str | Path, hf_config: dict[str, Any], tensors: dict[str, np.ndarray] | None
) -> Path:
    plan = plan_random_artifact(hf_config)
    writer = ArtifactWriter(
        path,
        architecture=plan.architecture,
        config=plan.config,
        metadata={"name": "gpu-test", "source": "tools/gpu/model_files.py", "converter": "test",
                  "created": None},
        generation={},
        tokenizer={"bos_token": None, "eos_token": None, "bos_token_id": None,
                   "eos_token_ids": [], "pad_token_id": None, "add_bos_token": False},
    )
    arrays = tensors or {}
    for name, array in arrays.items():
        writer.declare(name, "bf16", tuple(array.shape))
    writer.begin()
    for name, array in arrays.items():
        writer.write(name, f32_to_bf16_bits(np.ascontiguousarray(array, dtype=np.float32)))
    return writer.close()
