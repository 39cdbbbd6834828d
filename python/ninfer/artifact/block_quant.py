"""The fp8 (e4m3, 128×128 block scales) and nvfp4 (e2m1, per-16 e4m3 and per-row f32 scales)
element formats: encoding and decoding in numpy, bit for bit (docs/artifact-format.md).

Codes are rounded to nearest, ties to even code, as the hardware conversions and torch's
float8_e4m3fn cast do. numpy has no 8- or 4-bit floats, so both are done by table lookup.
"""

from __future__ import annotations

import numpy as np

from ninfer.artifact.layout import FP8_BLOCK, NVFP4_GROUP, quantized_layout

E4M3_MAX = 448.0
E2M1_MAX = 6.0


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.uint32)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 7).astype(np.float64)
    magnitude = np.where(
        exponent == 0,
        mantissa / 8 * 2.0**-6,
        (1 + mantissa / 8) * 2.0 ** (exponent.astype(np.float64) - 7),
    )
    values = np.where(codes & 0x80, -magnitude, magnitude)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


E4M3_VALUES = _e4m3_table()  # code → value (0x7F, 0xFF: NaN)
E2M1_VALUES = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)


def _round_to_codes(x: np.ndarray, magnitudes: np.ndarray, top: float, sign_bit: int) -> np.ndarray:
    """Index into the ascending non-negative `magnitudes` nearest to |x| (ties to the even
    index, saturating at `top`), with the sign in `sign_bit`."""
    a = np.minimum(np.abs(np.asarray(x, dtype=np.float32)), np.float32(top))
    hi = np.clip(np.searchsorted(magnitudes, a, side="left"), 1, len(magnitudes) - 1)
    lo = hi - 1
    below, above = a - magnitudes[lo], magnitudes[hi] - a
    pick_hi = (above < below) | ((above == below) & (hi % 2 == 0))
    index = np.where(pick_hi, hi, lo).astype(np.uint8)
    sign = np.signbit(x) & (index != 0)
    return index | (sign.astype(np.uint8) << np.uint8(sign_bit))


def f32_to_e4m3(x: np.ndarray) -> np.ndarray:
    """e4m3 (fn: no infinities) codes of float32 values, saturating at ±448."""
    return _round_to_codes(x, E4M3_VALUES[:0x7F], E4M3_MAX, 7)


def f32_to_e2m1(x: np.ndarray) -> np.ndarray:
    """e2m1 codes (0..15) of float32 values, saturating at ±6."""
    return _round_to_codes(x, E2M1_VALUES[:8], E2M1_MAX, 3)


def e4m3_to_f32(codes: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[np.asarray(codes, dtype=np.uint8)]


# --- fp8: one f32 scale per 128×128 block of each [N, K] matrix --------------------------


def fp8_block_scales(rows: np.ndarray) -> np.ndarray:
    """Block scales amax/448 (1 for an all-zero block) of a [n ≤ 128, K] row block."""
    n, k = rows.shape
    col_blocks = -(-k // FP8_BLOCK)
    padded = np.zeros((n, col_blocks * FP8_BLOCK), dtype=np.float32)
    padded[:, :k] = np.abs(rows)
    amax = padded.reshape(n, col_blocks, FP8_BLOCK).max(axis=(0, 2))
    return np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1.0)).astype(np.float32)


def fp8_encode_block(rows: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """e4m3 codes of a [n ≤ 128, K] row block under its per-128-column `scales`."""
    expanded = np.repeat(scales, FP8_BLOCK)[: rows.shape[1]]
    return f32_to_e4m3(rows / expanded[None, :])


def quantize_fp8(values: np.ndarray) -> np.ndarray:
    """Whole fp8 tensor bytes (codes, then scales) of a float32 [..., N, K] array."""
    values = np.asarray(values, dtype=np.float32)
    layout = quantized_layout("fp8", values.shape)
    matrices = values.reshape(-1, layout["group_rows"], layout["cols"])
    codes, scales = [], []
    for matrix in matrices:
        for r0 in range(0, matrix.shape[0], FP8_BLOCK):
            block = matrix[r0 : r0 + FP8_BLOCK]
            s = fp8_block_scales(block)
            codes.append(fp8_encode_block(block, s))
            scales.append(s)
    return assemble_fp8(layout, codes, scales)


def assemble_fp8(
    layout: dict[str, int], codes: list[np.ndarray], scales: list[np.ndarray]
) -> np.ndarray:
    out = np.zeros(layout["nbytes"], dtype=np.uint8)
    flat = np.concatenate([c.reshape(-1) for c in codes]) if codes else np.zeros(0, np.uint8)
    out[: layout["codes"]] = flat
    s = (
        np.concatenate([x.reshape(-1) for x in scales]).astype("<f4")
        if scales
        else np.zeros(0, "<f4")
    )
    out[layout["scale_offset"] :] = s.view(np.uint8)
    return out


def dequantize_fp8(raw: np.ndarray, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """float32 values of logical `shape` from whole fp8 tensor bytes."""
    layout = quantized_layout("fp8", shape)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    g, n, k = layout["rows"] // max(layout["group_rows"], 1), layout["group_rows"], layout["cols"]
    codes = e4m3_to_f32(raw[: layout["codes"]]).reshape(g, n, k)
    scales = raw[layout["scale_offset"] : layout["nbytes"]].view("<f4")
    scales = scales.reshape(g, layout["row_blocks"], layout["col_blocks"])
    expanded = np.repeat(np.repeat(scales, FP8_BLOCK, axis=1), FP8_BLOCK, axis=2)[:, :n, :k]
    return (codes * expanded).reshape(shape)


# --- nvfp4: e2m1 codes, e4m3 scale per 16 values, f32 scale per row ------------------------


def nvfp4_encode_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed codes [n, K/2], e4m3 group scales [n, K/16], f32 row scales [n]) of [n, K]
    float32 rows: g = amax(row)/2688, s16 = e4m3(amax16/(6g)), code = e2m1(w/(s16·g)).
    Even k sits in the low nibble of its byte (ModelOpt's packing)."""
    rows = np.asarray(rows, dtype=np.float32)
    n, k = rows.shape
    amax = np.abs(rows).max(axis=1) if k else np.zeros(n, np.float32)
    row_scale = np.where(amax > 0, amax / np.float32(E2M1_MAX * E4M3_MAX), np.float32(1.0)).astype(
        np.float32
    )
    groups = rows.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
    amax16 = np.abs(groups).max(axis=2)
    s16_codes = f32_to_e4m3(amax16 / (np.float32(E2M1_MAX) * row_scale[:, None]))
    s16 = e4m3_to_f32(s16_codes)
    denominator = s16 * row_scale[:, None]
    scaled = np.divide(
        groups,
        denominator[:, :, None],
        out=np.zeros_like(groups),
        where=denominator[:, :, None] != 0,
    )
    codes = f32_to_e2m1(scaled).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))).astype(np.uint8)
    return packed, s16_codes, row_scale


def assemble_nvfp4(
    layout: dict[str, int], packed: np.ndarray, s16: np.ndarray, row_scale: np.ndarray
) -> np.ndarray:
    out = np.zeros(layout["nbytes"], dtype=np.uint8)
    out[: layout["codes"]] = packed.reshape(-1)
    out[layout["scale_offset"] : layout["scale_offset"] + s16.size] = s16.reshape(-1)
    out[layout["scale2_offset"] :] = np.asarray(row_scale, dtype="<f4").reshape(-1).view(np.uint8)
    return out


def quantize_nvfp4(values: np.ndarray) -> np.ndarray:
    """Whole nvfp4 tensor bytes of a float32 [..., N, K] array."""
    values = np.asarray(values, dtype=np.float32)
    layout = quantized_layout("nvfp4", values.shape)
    packed, s16, row_scale = nvfp4_encode_rows(values.reshape(layout["rows"], layout["cols"]))
    return assemble_nvfp4(layout, packed, s16, row_scale)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """[n, K/2] packed bytes → [n, K] e2m1 codes (even k from the low nibble)."""
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.uint8)
    codes[..., 0::2] = packed & 0xF
    codes[..., 1::2] = packed >> 4
    return codes


def dequantize_nvfp4(raw: np.ndarray, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    layout = quantized_layout("nvfp4", shape)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    n, k = layout["rows"], layout["cols"]
    codes = unpack_e2m1(raw[: layout["codes"]].reshape(n, k // 2))
    s16 = e4m3_to_f32(raw[layout["scale_offset"] : layout["scale_offset"] + n * k // NVFP4_GROUP])
    row_scale = raw[layout["scale2_offset"] : layout["nbytes"]].view("<f4")
    values = E2M1_VALUES[codes].reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
    values = values * s16.reshape(n, -1, 1) * row_scale.reshape(n, 1, 1)
    return values.reshape(shape).astype(np.float32)
