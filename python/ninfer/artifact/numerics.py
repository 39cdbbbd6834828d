"""Conversions between float32 and the stored element formats (bf16 bits, Q8_0 blocks)."""

from __future__ import annotations

import numpy as np

from ninfer.artifact.layout import Q8_0_BLOCK, Q8_0_BLOCK_BYTES

Q8_0_DTYPE = np.dtype([("scale", "<f2"), ("q", "i1", (Q8_0_BLOCK,))])
assert Q8_0_DTYPE.itemsize == Q8_0_BLOCK_BYTES


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest, ties to even) and return the uint16 bit patterns."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # rounding could carry a NaN payload into infinity; keep it a quiet NaN
        out[nan] = np.uint16(0x7FC0)
    return out


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Q8_0 blocks along the last axis: returns uint8 of shape [..., cols / 32 * 34].

    Same rule as GGUF: scale d = max|x| / 127 stored as fp16, q = round(x / d).
    """
    x = np.asarray(x, dtype=np.float32)
    cols = x.shape[-1]
    if cols % Q8_0_BLOCK:
        raise ValueError(f"q8_0 needs a last dimension divisible by {Q8_0_BLOCK}, got {cols}")
    blocks = x.reshape(-1, Q8_0_BLOCK)
    scale = np.abs(blocks).max(axis=1) / np.float32(127.0)
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    out = np.empty(blocks.shape[0], dtype=Q8_0_DTYPE)
    out["scale"] = scale.astype(np.float16)
    out["q"] = np.clip(np.rint(blocks * inverse[:, None]), -127, 127).astype(np.int8)
    return out.view(np.uint8).reshape(*x.shape[:-1], cols // Q8_0_BLOCK * Q8_0_BLOCK_BYTES)


def dequantize_q8_0(raw: np.ndarray, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """float32 array of logical `shape` from Q8_0 block bytes."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1).view(Q8_0_DTYPE)
    values = blocks["q"].astype(np.float32) * blocks["scale"].astype(np.float32)[:, None]
    return values.reshape(shape)
