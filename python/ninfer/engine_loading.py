"""Everything AsyncEngine.open needs from an artifact: header, tokenizer (whose token byte
table the core matches stop strings on), the chat template and the native engine itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer.artifact import read_header
from ninfer.engine_types import EngineConfig
from ninfer.tokenizer import Tokenizer


@dataclass
class EngineParts:
    core: Any
    tokenizer: Any
    header: dict[str, Any]
    model_info: dict[str, Any]
    chat_template: str | None


def apply_cuda_graphs(config: EngineConfig) -> None:
    """--no-cuda-graph: the CUDA backend reads NINFER_CUDA_GRAPHS before every decode step
    (cuda_step_graphs.cpp), so turning graphs off is setting it for this process; when graphs
    are wanted the environment is left as the operator set it."""
    if not config.cuda_graphs:
        os.environ["NINFER_CUDA_GRAPHS"] = "0"


def load_engine_parts(path: Path, config: EngineConfig) -> EngineParts:
    from ninfer import _core
    from ninfer.engine import core_options

    artifact = read_header(path)
    header = artifact.header
    if config.random_weights_seed is None and is_header_only(header):
        raise ValueError(
            f"artifact '{path}' holds no weights (it was written header-only); "
            "it can only be served with random weights (ninfer-serve --load-format dummy)"
        )
    if not artifact.has_resource("tokenizer.json"):
        raise ValueError(f"artifact '{path}' has no tokenizer.json resource")
    section = header.get("tokenizer") or {}
    eos_ids = list(section.get("eos_token_ids") or [])
    tokenizer = Tokenizer(
        artifact.resource("tokenizer.json"),
        bos_token_id=section.get("bos_token_id"),
        eos_token_ids=eos_ids,
        add_bos_token=bool(section.get("add_bos_token", False)),
    )
    apply_cuda_graphs(config)
    core = _core.Engine.open(
        str(path),
        core_options(config, eos_ids),
        tokenizer.token_bytes(),
        threads=config.threads,
        device=config.device,
        random_weights_seed=_weights_seed(config.random_weights_seed),
        tensor_parallel_size=config.tensor_parallel_size,
        **_dummy_dtype(header, config),
    )
    core.set_grammar_special_ids(tokenizer.special_token_ids())
    chat_template = None
    if artifact.has_resource("chat_template.jinja"):
        chat_template = artifact.resource("chat_template.jinja").decode()
    info = core.model_info
    cfg = header.get("config") or {}
    model_info = {
        "n_vocab": info["vocab_size"],
        "n_ctx": min(core.max_context, core.kv_capacity),
        "kv_capacity": core.kv_capacity,
        "kv_dtype": config.kv_dtype,
        "prefix_reuse": config.prefix_reuse,
        "n_ctx_train": cfg.get("max_position_embeddings") or info["max_position_embeddings"],
        "n_embd": info["hidden_size"],
        "n_params": info["num_params"],
        "size": info["weight_bytes"],
        "ftype": info["weight_format"],
        "architecture": header.get("architecture", info["architecture"]),
        "name": (header.get("metadata") or {}).get("name") or path.stem,
    }
    return EngineParts(core, tokenizer, header, model_info, chat_template)


def _dummy_dtype(header: dict[str, Any], config: EngineConfig) -> dict[str, str]:
    """The format of the dummy weights: the dtype a header-only artifact was written for
    (`ninfer-convert --header-only --dtype fp8`); bf16 otherwise."""
    dtype = (header.get("metadata") or {}).get("dummy_weights_dtype")
    if config.random_weights_seed is None or not dtype or dtype == "bf16":
        return {}  # the core's default, and older cores without the argument
    return {"random_weights_dtype": str(dtype)}


def is_header_only(header: dict[str, Any]) -> bool:
    """True for an artifact without a tensor table (`ninfer-convert --header-only`)."""
    return not header.get("tensors")


def _weights_seed(seed: int | None) -> int:
    # The core takes a non-negative seed (-1 = read the weights); any Python int maps to one.
    return -1 if seed is None else seed & 0x7FFF_FFFF_FFFF_FFFF
