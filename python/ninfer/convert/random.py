"""Seeded random-weight artifacts of any supported config, for tests and benchmarks.

Tensors are generated and written one row block at a time, so a 27B-shaped artifact needs
no more memory than one block. The same (config, seed, dtype, tokenizer) gives identical bytes.
`plan_random_artifact` gives the tensor table alone, so the real model shapes can be checked
(and their size shown) without writing anything.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact import ArtifactWriter
from ninfer.artifact.layout import tensor_nbytes
from ninfer.convert.header_fields import generation_defaults, metadata, tokenizer_section
from ninfer.convert.model_config import architecture_of, expected_tensors, normalize_config
from ninfer.convert.progress import progress_bar
from ninfer.convert.qwen3_5_config import (
    hybrid_architecture_of,
    normalize_qwen3_5_config,
    qwen3_5_expected_tensors,
)
from ninfer.convert.synthetic_tokenizer import (
    CHATML_TEMPLATE,
    synthetic_token_ids,
    synthetic_tokenizer_json,
)
from ninfer.convert.tensor_encoder import TensorEncoder
from ninfer.convert.tensors import row_ranges, stored_dtype

WEIGHT_STD = 0.02  # small enough that activations stay finite through many random layers
# Qwen3.5 norm gains vary this much around their centre, so a parity test notices a gain
# applied to the wrong channel or head, or `w` used where `1 + w` belongs (spec §8.1).
HYBRID_NORM_STD = 0.1
SYNTHETIC = "synthetic"  # `tokenizer=` value: the small generated tokenizer, for any config

# Header tokenizer facts of the real Qwen3.5/3.6 tokenizer (model spec §1.1, §6.1).
QWEN3_5_TOKENIZER_FIELDS = {
    "bos_token": None, "eos_token": "<|im_end|>", "bos_token_id": None,
    "eos_token_ids": [248046, 248044], "pad_token_id": 248044, "add_bos_token": False,
}


@dataclass(frozen=True)
class RandomPlan:
    """What `make_random_artifact` would write, without the data."""

    architecture: str
    config: dict[str, Any]  # normalized header config
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name → (stored dtype, shape), in order

    @property
    def parameters(self) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors.values())

    @property
    def tensor_bytes(self) -> int:
        return sum(tensor_nbytes(dtype, shape) for dtype, shape in self.tensors.values())


# The formats `--load-format dummy` makes weights in (the backends' random_quantized_weight).
DUMMY_WEIGHT_DTYPES = ("bf16", "fp8", "nvfp4")

def plan_random_artifact(config: dict[str, Any], *, dtype: str = "bf16") -> RandomPlan:
    """Architecture, normalized config and tensor table for the HF-style `config`."""
    hybrid = hybrid_architecture_of(config)
    if hybrid is not None:
        architecture = hybrid
        normalized = normalize_qwen3_5_config(hybrid, config)
        shapes = qwen3_5_expected_tensors(normalized)
    else:
        architecture = architecture_of(config)
        normalized = normalize_config(architecture, config)
        shapes = expected_tensors(normalized)
    requested = "bf16" if dtype == "keep" else dtype
    tensors = {n: (stored_dtype(s, "f32", requested, n), tuple(s)) for n, s in shapes.items()}
    return RandomPlan(architecture, normalized, tensors)


def _tensor_rng(seed: int, name: str) -> np.random.Generator:
    # Seeded per tensor by name, so a tensor's values do not depend on the tensors before it.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _random_rows(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    values = _normal(rng, shape, WEIGHT_STD)
    if name.endswith("norm.weight"):  # RMSNorm gains live around 1, not 0
        values += np.float32(1.0)
    return values


def _is_norm_gain(name: str) -> bool:
    # input_layernorm, q_norm, model.norm, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, …
    module = name.removesuffix(".weight").rsplit(".", 1)[-1]
    return name.endswith(".weight") and "norm" in module


def _random_hybrid_rows(rng: np.random.Generator, name: str,
                        shape: tuple[int, ...]) -> np.ndarray:
    """Qwen3.5/3.6 values in the ranges transformers initialises them to, with spread."""
    if name.endswith("linear_attn.A_log"):
        # HF: A ~ U(0.01, 16), stored as log A; the per-step decay exp(-A·softplus(a + dt))
        # then ranges from almost 1 (long memory) to almost 0 across heads.
        return np.log(rng.uniform(0.01, 16.0, shape)).astype(np.float32)
    if name.endswith("linear_attn.dt_bias"):
        return np.float32(1.0) + _normal(rng, shape, 0.1)  # HF: ones; varied per head
    if name.endswith("linear_attn.norm.weight"):
        return np.float32(1.0) + _normal(rng, shape, HYBRID_NORM_STD)  # plain gain (spec §2.4)
    if _is_norm_gain(name):
        return _normal(rng, shape, HYBRID_NORM_STD)  # zero-centred (1 + w) gains (spec §2.2)
    if name.endswith("linear_attn.conv1d.weight"):
        # A depthwise tap sees only `kernel` inputs; fan-in scaling keeps the conv output the
        # size of its input (HF's 0.02 would shrink q, k and v fifty-fold).
        return _normal(rng, shape, 1.0 / math.sqrt(shape[-1]))
    return _normal(rng, shape, WEIGHT_STD)


def _tokenizer_size(tokenizer_json: bytes) -> int:
    document = json.loads(tokenizer_json)
    vocab = document["model"].get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [token["id"] for token in document.get("added_tokens") or []]
    return max(ids) + 1 if ids else 0


def _tokenizer(tokenizer: bytes | str | Path | None, hybrid: bool,
               config: dict[str, Any]) -> tuple[bytes, dict[str, Any], int]:
    """tokenizer.json bytes, the header's tokenizer section and the number of ids used."""
    if tokenizer is None and hybrid:
        from ninfer.prompt.qwen_tokenizer import (
            BASE_VOCAB_SIZE,
            QWEN3_5_ADDED_TOKENS,
            qwen3_5_tokenizer_json,
        )

        # The size is known: parsing 15 MB of JSON to count it costs seconds.
        size = BASE_VOCAB_SIZE + len(QWEN3_5_ADDED_TOKENS)
        return qwen3_5_tokenizer_json().read_bytes(), dict(QWEN3_5_TOKENIZER_FIELDS), size
    if tokenizer is None or tokenizer == SYNTHETIC:
        ids = synthetic_token_ids()
        data = synthetic_tokenizer_json()
        return data, {
            "bos_token": None, "eos_token": "<|im_end|>", "bos_token_id": None,
            "eos_token_ids": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"], "add_bos_token": False,
        }, _tokenizer_size(data)
    data = tokenizer if isinstance(tokenizer, bytes) else Path(tokenizer).read_bytes()
    return data, tokenizer_section(json.loads(data), {}, config, {}), _tokenizer_size(data)


def _stored_config_json(config: dict[str, Any], architecture: str, hybrid: bool) -> bytes:
    # model_type lets transformers.AutoConfig rebuild the reference model from this resource.
    model_type = architecture
    if hybrid and "text_config" not in config:
        model_type = architecture + "_text"  # a flat Qwen3.5 config is the text config
    return json.dumps({"model_type": model_type, **config}, indent=2, sort_keys=True).encode()


def make_random_artifact(
    config: dict[str, Any],
    output: str | Path,
    *,
    seed: int = 0,
    dtype: str = "bf16",
    tokenizer: bytes | str | Path | None = None,
    chat_template: str | None = None,
    name: str | None = None,
    generation: dict[str, Any] | None = None,
    header_only: bool = False,
    progress: bool = False,
) -> Path:
    """Write a random-weight artifact for the HF-style `config` (a config.json dict).

    `tokenizer` is tokenizer.json content (bytes), a path to one, or "synthetic" for a small
    deterministic byte-level BPE with ChatML tokens. By default Qwen3.5/3.6 configs get the
    real Qwen3.5/3.6 tokenizer and NInfer's qwen3_5 chat template, other configs the
    synthetic tokenizer and a ChatML template. `generation` is a generation_config.json dict
    whose sampling defaults go into the header.

    `header_only` writes the header, tokenizer and template with an empty tensor table: such
    an artifact is served with weights the engine makes itself (`ninfer-serve
    --load-format dummy`), so a 27B-shaped benchmark needs no 54 GB file. Its `dtype` (bf16,
    fp8 or nvfp4; metadata `dummy_weights_dtype`) is the format the engine makes the matrices
    in that an artifact of that dtype would quantize (Qwen3.5/3.6 models only).
    """
    plan = plan_random_artifact(config, dtype=dtype)
    hybrid = plan.architecture in ("qwen3_5", "qwen3_5_moe")
    if header_only and dtype not in DUMMY_WEIGHT_DTYPES:
        raise ValueError(
            f"a header-only artifact's dummy weights are {', '.join(DUMMY_WEIGHT_DTYPES)}, "
            f"not {dtype}"
        )
    if header_only and dtype != "bf16" and not hybrid:
        raise ValueError(
            f"{dtype} dummy weights are made for Qwen3.5/3.6 models only "
            f"({plan.architecture} makes bf16)"
        )
    tokenizer_json, tokenizer_fields, needed = _tokenizer(tokenizer, hybrid, config)
    if plan.config["vocab_size"] < needed:
        raise ValueError(
            f"config vocab_size {plan.config['vocab_size']} is smaller than the tokenizer's "
            f"{needed} ids" + (" (give tokenizer='synthetic' / --tokenizer synthetic for a "
                               "small vocabulary)" if hybrid and tokenizer is None else "")
        )
    if chat_template is None:
        from ninfer.prompt.builtin_templates import template_for_architecture

        chat_template = template_for_architecture(plan.architecture) or CHATML_TEMPLATE
    fields = metadata(name or f"random-{plan.architecture}",
                      "random, header only" if header_only else f"random seed={seed}",
                      created=None)
    if header_only:
        fields["dummy_weights_dtype"] = dtype
    writer = ArtifactWriter(
        output,
        architecture=plan.architecture,
        config=plan.config,
        metadata=fields,
        generation=generation_defaults(generation or {}),
        tokenizer=tokenizer_fields,
    )
    tensors = {} if header_only else plan.tensors
    for tensor_name, (tensor_dtype, shape) in tensors.items():
        writer.declare(tensor_name, tensor_dtype, shape)
    writer.add_resource("tokenizer.json", tokenizer_json)
    writer.add_resource("chat_template.jinja", chat_template.encode())
    writer.add_resource("config.json", _stored_config_json(config, plan.architecture, hybrid))
    rows = _random_hybrid_rows if hybrid else _random_rows
    try:
        writer.begin()
        parameters = sum(math.prod(shape) for _, shape in tensors.values())
        with progress_bar(parameters, "random weights", enabled=progress and parameters > 0) as bar:
            for tensor_name, (tensor_dtype, shape) in tensors.items():
                rng = _tensor_rng(seed, tensor_name)
                encoder = TensorEncoder(writer, tensor_name, tensor_dtype, shape)
                for start, stop in row_ranges(shape):  # fixed blocks: a fixed rng sequence
                    values = rows(rng, tensor_name, (stop - start, *shape[1:]))
                    encoder.add_array(values, "f32")
                    bar.update(values.size)
                encoder.finish()
        return writer.close()
    except BaseException:
        writer.abort()
        raise
