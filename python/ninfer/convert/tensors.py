"""Choosing each tensor's stored dtype and encoding source arrays into it, chunk by chunk."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ninfer.artifact import ArtifactWriter, bf16_bits_to_f32, f32_to_bf16_bits, quantize_q8_0
from ninfer.artifact.layout import Q8_0_BLOCK

TARGET_DTYPES = ("keep", "f32", "bf16", "q8_0", "fp8", "nvfp4")
QUANTIZED_DTYPES = ("fp8", "nvfp4")
# Matrices that stay bf16 under fp8/nvfp4, as the official FP8 and NVFP4 releases keep them:
# the embedding (one row read per token), lm_head, the MoE router and shared-expert gate, the
# GDN's small a/b projections and conv taps, and the MTP head.
_KEPT_UNQUANTIZED = ("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight",
                     "shared_expert_gate.weight", "in_proj_a.weight", "in_proj_b.weight",
                     "conv1d.weight")
# Source arrays are numpy arrays in one of these element encodings (bf16 as uint16 bits).
SOURCE_NUMPY = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "bf16": np.dtype("<u2")}
_CHUNK_ELEMENTS = 1 << 22  # 16 MB of float32 per step bounds memory on huge embeddings


def quantizable(name: str, shape: tuple[int, ...], dtype: str) -> bool:
    """Whether the matrix `name` may be stored as fp8/nvfp4 `dtype` (else it is bf16)."""
    if len(shape) < 2 or name.endswith(_KEPT_UNQUANTIZED) or name.startswith("mtp."):
        return False
    return shape[-1] % (16 if dtype == "fp8" else 32) == 0


def stored_dtype(shape: tuple[int, ...], source: str, requested: str, name: str = "") -> str:
    """Norms, biases and other 1-D tensors stay f32; matrices follow `requested` (`keep`:
    the source's format), except those `quantizable` excludes from fp8/nvfp4 (bf16)."""
    if requested not in TARGET_DTYPES:
        raise ValueError(f"unknown --dtype {requested!r}; choose one of {', '.join(TARGET_DTYPES)}")
    if len(shape) < 2:
        return "f32"
    target = source if requested == "keep" else requested
    if target in QUANTIZED_DTYPES and not quantizable(name, shape, target):
        return "bf16"
    if target == "q8_0" and shape[-1] % Q8_0_BLOCK:
        return "bf16"  # q8_0 blocks need rows divisible by 32; keep such rare matrices exact-ish
    return target


def to_f32(array: np.ndarray, source: str) -> np.ndarray:
    if source == "bf16":
        return bf16_bits_to_f32(array)
    return np.asarray(array, dtype=np.float32)


def encode(array: np.ndarray, source: str, target: str) -> np.ndarray:
    """`array` (source encoding) in the stored encoding of `target`."""
    if source == target:
        return np.ascontiguousarray(array)
    if target == "bf16" and source == "f16":
        return f32_to_bf16_bits(array.astype(np.float32))
    values = to_f32(array, source)
    if target == "f32":
        return values
    if target == "bf16":
        return f32_to_bf16_bits(values)
    if target == "f16":
        return values.astype(np.float16)
    if target == "q8_0":
        return quantize_q8_0(values)
    raise ValueError(f"cannot store {source} as {target}")


def row_ranges(shape: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """[start, stop) blocks of leading-axis rows of about _CHUNK_ELEMENTS elements each."""
    if len(shape) < 2:
        yield 0, shape[0] if shape else 1
        return
    per_row = max(1, int(np.prod(shape[1:])))
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // per_row)
    for start in range(0, shape[0], rows_per_chunk):
        yield start, min(start + rows_per_chunk, shape[0])


def row_chunks(array: np.ndarray) -> Iterator[np.ndarray]:
    if array.ndim < 2:
        yield array
        return
    for start, stop in row_ranges(array.shape):
        yield array[start:stop]


def write_encoded(
    writer: ArtifactWriter, name: str, array: np.ndarray, source: str, target: str
) -> None:
    """Encode and write one declared tensor in row chunks (the source may be a memory map)."""
    for chunk in row_chunks(array):
        writer.write_part(name, encode(chunk, source, target))
