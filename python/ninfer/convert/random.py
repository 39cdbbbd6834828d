"""Seeded random-weight artifacts of any supported config, for tests and benchmarks.

Tensors are generated and written one row block at a time, so a 27B-shaped artifact needs
no more memory than one block. The same (config, seed, dtype, tokenizer) gives identical bytes.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact import ArtifactWriter
from ninfer.convert.header_fields import metadata, tokenizer_section
from ninfer.convert.model_config import architecture_of, expected_tensors, normalize_config
from ninfer.convert.progress import progress_bar
from ninfer.convert.synthetic_tokenizer import (
    CHATML_TEMPLATE,
    synthetic_token_ids,
    synthetic_tokenizer_json,
)
from ninfer.convert.tensors import encode, row_ranges, stored_dtype

WEIGHT_STD = 0.02  # small enough that activations stay finite through many random layers


def _tensor_rng(seed: int, name: str) -> np.random.Generator:
    # Seeded per tensor by name, so a tensor's values do not depend on the tensors before it.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _random_rows(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(WEIGHT_STD)
    if name.endswith("norm.weight"):  # RMSNorm gains live around 1, not 0
        values += np.float32(1.0)
    return values


def _tokenizer_fields(
    tokenizer_json: bytes, hf_config: dict[str, Any], synthetic: bool
) -> dict[str, Any]:
    if synthetic:
        ids = synthetic_token_ids()
        return {
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "bos_token_id": None,
            "eos_token_ids": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "add_bos_token": False,
        }
    return tokenizer_section(json.loads(tokenizer_json), {}, hf_config, {})


def _tokenizer_size(tokenizer_json: bytes) -> int:
    document = json.loads(tokenizer_json)
    vocab = document["model"].get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [token["id"] for token in document.get("added_tokens") or []]
    return max(ids) + 1 if ids else 0


def make_random_artifact(
    config: dict[str, Any],
    output: str | Path,
    *,
    seed: int = 0,
    dtype: str = "bf16",
    tokenizer: bytes | str | Path | None = None,
    chat_template: str | None = None,
    name: str | None = None,
    progress: bool = False,
) -> Path:
    """Write a random-weight artifact for the HF-style `config` (a config.json dict).

    `tokenizer` is tokenizer.json content (bytes) or a path to one; by default a small
    deterministic byte-level BPE with ChatML tokens is generated.
    """
    architecture = architecture_of(config)
    normalized = normalize_config(architecture, config)
    synthetic = tokenizer is None
    if tokenizer is None:
        tokenizer_json = synthetic_tokenizer_json()
    elif isinstance(tokenizer, bytes):
        tokenizer_json = tokenizer
    else:
        tokenizer_json = Path(tokenizer).read_bytes()
    needed = _tokenizer_size(tokenizer_json)
    if normalized["vocab_size"] < needed:
        raise ValueError(
            f"config vocab_size {normalized['vocab_size']} is smaller than the tokenizer's "
            f"{needed} ids"
        )
    requested = "bf16" if dtype == "keep" else dtype
    writer = ArtifactWriter(
        output,
        architecture=architecture,
        config=normalized,
        metadata=metadata(name or f"random-{architecture}", f"random seed={seed}", created=None),
        generation={},
        tokenizer=_tokenizer_fields(tokenizer_json, config, synthetic),
    )
    shapes = expected_tensors(normalized)
    targets = {n: stored_dtype(s, "f32", requested) for n, s in shapes.items()}
    for tensor_name, shape in shapes.items():
        writer.declare(tensor_name, targets[tensor_name], shape)
    writer.add_resource("tokenizer.json", tokenizer_json)
    writer.add_resource("chat_template.jinja", (chat_template or CHATML_TEMPLATE).encode())
    writer.add_resource("config.json", json.dumps(config, indent=2, sort_keys=True).encode())
    try:
        writer.begin()
        total = sum(int(np.prod(s)) for s in shapes.values())
        with progress_bar(total, "random weights", enabled=progress) as bar:
            for tensor_name, shape in shapes.items():
                rng = _tensor_rng(seed, tensor_name)
                for start, stop in row_ranges(shape):  # fixed blocks: a fixed rng sequence
                    values = _random_rows(rng, tensor_name, (stop - start, *shape[1:]))
                    writer.write_part(tensor_name, encode(values, "f32", targets[tensor_name]))
                    bar.update(values.size)
        return writer.close()
    except BaseException:
        writer.abort()
        raise
