"""float64 reference of the quantized KV formats (native/cache/kv_format.h), for the tests.

`quantize` rebuilds each token-head row's codes and scales from first principles (amax, the
e4m3 / e2m1 value grids, nearest value with ties to the even code), and `decode_region`
reads a stored page region back, so both the host codec and the device write kernel can be
checked against them.
"""

from __future__ import annotations

import numpy as np

KV_DTYPES = ("fp8", "int8", "nvfp4")
GROUP = 16


def e4m3_values() -> np.ndarray:
    """Values of e4m3 codes 0..126 (the finite non-negative ones, ascending)."""
    codes = np.arange(127)
    exponent, mantissa = codes >> 3, codes & 7
    return np.where(
        exponent == 0, mantissa * 2.0**-9, (1 + mantissa / 8.0) * 2.0 ** (exponent - 7.0)
    )


E4M3 = e4m3_values()
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    codes = codes.astype(np.int64)
    magnitude = E4M3[np.minimum(codes & 0x7F, 126)]
    return np.where(codes & 0x80, -magnitude, magnitude)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    codes = codes.astype(np.int64)
    return np.where(codes & 8, -E2M1[codes & 7], E2M1[codes & 7])


def _nearest(grid: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest grid value to |x| (ties to the even index), saturating."""
    a = np.minimum(np.abs(x), grid[-1])
    hi = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    return np.where(pick_lo, lo, hi)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    index = _nearest(E4M3, x)
    return (np.where(np.signbit(x) & (index != 0), 0x80, 0) | index).astype(np.uint8)


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    index = _nearest(E2M1, x)
    return (np.where(np.signbit(x) & (index != 0), 8, 0) | index).astype(np.uint8)


def quantize(x: np.ndarray, kv_dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, group scales, scales) of rows x [n, head_dim] (f32 arithmetic, as stored)."""
    x = x.astype(np.float32)
    amax = np.abs(x).max(axis=1)
    if kv_dtype in ("fp8", "int8"):
        scale = (amax / np.float32(448.0 if kv_dtype == "fp8" else 127.0)).astype(np.float32)
        inv = np.where(scale > 0, np.float32(1.0) / np.maximum(scale, 1e-38), 0).astype(np.float32)
        y = (x * inv[:, None]).astype(np.float32)
        if kv_dtype == "fp8":
            codes = e4m3_encode(y)
        else:
            codes = np.clip(np.rint(y), -127, 127).astype(np.int8).view(np.uint8)
        return codes, np.zeros((len(x), 0), np.uint8), scale
    scale = (amax / np.float32(6.0 * 448.0)).astype(np.float32)
    inv = np.where(scale > 0, np.float32(1.0) / np.maximum(scale, 1e-38), 0).astype(np.float32)
    groups = x.reshape(len(x), -1, GROUP)
    gmax = np.abs(groups).max(axis=2)
    group_codes = e4m3_encode((gmax * inv[:, None]).astype(np.float32) / np.float32(6.0))
    step = (e4m3_decode(group_codes).astype(np.float32) * scale[:, None]).astype(np.float32)
    step_inv = np.where(step > 0, np.float32(1.0) / np.maximum(step, 1e-38), 0).astype(np.float32)
    nibbles = e2m1_encode((groups * step_inv[:, :, None]).astype(np.float32)).reshape(len(x), -1)
    codes = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8)
    return codes, group_codes, scale


def dequantize(codes, groups, scale, kv_dtype: str, head_dim: int) -> np.ndarray:
    """float64 values of rows stored as (codes, group scales, scales)."""
    scale = scale.astype(np.float64)[:, None]
    if kv_dtype == "fp8":
        return e4m3_decode(codes) * scale
    if kv_dtype == "int8":
        return codes.view(np.int8).astype(np.float64) * scale
    nibbles = np.empty((len(codes), head_dim), np.uint8)
    nibbles[:, 0::2], nibbles[:, 1::2] = codes & 15, codes >> 4
    step = e4m3_decode(groups).astype(np.float32) * scale.astype(np.float32)
    return e2m1_decode(nibbles) * np.repeat(step.astype(np.float64), GROUP, axis=1)


def region_layout(kv_dtype: str, kv_heads: int, head_dim: int) -> dict[str, int]:
    rows = 64 * kv_heads
    code_bytes = head_dim // 2 if kv_dtype == "nvfp4" else head_dim
    group_bytes = head_dim // GROUP if kv_dtype == "nvfp4" else 0
    groups_offset = rows * code_bytes
    scales_offset = groups_offset + (rows * group_bytes + 15) // 16 * 16
    return {
        "code_bytes": code_bytes,
        "group_bytes": group_bytes,
        "groups_offset": groups_offset,
        "scales_offset": scales_offset,
        "bytes": scales_offset + rows * 4,
    }


def decode_region(region: np.ndarray, kv_dtype: str, kv_heads: int, head_dim: int):
    """A stored (layer, page, K|V) region -> (codes, groups, scales, values [64, heads, hd])."""
    lay = region_layout(kv_dtype, kv_heads, head_dim)
    rows = 64 * kv_heads
    codes = region[: lay["groups_offset"]].reshape(rows, lay["code_bytes"])
    groups = region[lay["groups_offset"] : lay["groups_offset"] + rows * lay["group_bytes"]]
    groups = groups.reshape(rows, lay["group_bytes"])
    scales = region[lay["scales_offset"] : lay["bytes"]].view(np.float32)
    values = dequantize(codes, groups, scales, kv_dtype, head_dim)
    return codes, groups, scales, values.reshape(64, kv_heads, head_dim)


def attention_reference(q, keys, values, slices, scale) -> np.ndarray:
    """float64 causal GQA attention: q [rows, heads, hd], keys/values[i] [len, kv_heads, hd]."""
    nh, nkv = q.shape[1], keys[0].shape[1]
    group = nh // nkv
    out, row = [], 0
    for (start, count, _), k, v in zip(slices, keys, values, strict=True):
        qs = q[row : row + count].astype(np.float64)
        k64, v64 = k.astype(np.float64), v.astype(np.float64)
        visible = np.arange(start + count)[None, :] <= (start + np.arange(count))[:, None]
        heads = []
        for h in range(nh):
            s = qs[:, h] @ k64[:, h // group].T * scale
            s = np.where(visible, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            heads.append(p @ v64[:, h // group] / p.sum(axis=1, keepdims=True))
        out.append(np.stack(heads, axis=1))
        row += count
    return np.concatenate(out)
