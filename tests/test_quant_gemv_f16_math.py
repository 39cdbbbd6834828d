"""The number facts the staged fp16 GEMV (native/backends/cuda/kernels_gemv_quant_staged.cuh)
rests on, checked exhaustively on the CPU: every e2m1 code times every finite e4m3 group scale
is exact in f16 (so the product formed before the mma loses nothing), the f16 encodings of the
e2m1 magnitudes have zero low bytes and the high bytes of the kernel's table, every e4m3 value
is exact in f16, and bf16 activations times 2^-8 are exact in f16 over the range the kernel
documents.
"""

from __future__ import annotations

import numpy as np

from ninfer.artifact import bf16_bits_to_f32
from ninfer.artifact.block_quant import E4M3_VALUES

E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# kHiA = 0x3E3C3800, kHiB = 0x46444240: byte j of the pair is the high byte of magnitude j
KERNEL_HIGH_BYTES = [0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46]


def exact_in_f16(values: np.ndarray) -> bool:
    v = np.asarray(values, dtype=np.float64)
    return bool(np.all(v.astype(np.float16).astype(np.float64) == v))


def finite_e4m3() -> np.ndarray:
    values = E4M3_VALUES.astype(np.float64)
    return values[np.isfinite(values)]


def test_e2m1_magnitudes_are_one_high_byte_in_f16():
    bits = E2M1_MAGNITUDES.astype(np.float16).view(np.uint16)
    assert np.all(bits & 0xFF == 0)
    assert (bits >> 8).tolist() == KERNEL_HIGH_BYTES


def test_e4m3_values_are_exact_in_f16():
    assert exact_in_f16(finite_e4m3())


def test_every_e2m1_code_times_every_group_scale_is_exact_in_f16():
    codes = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])
    products = codes[:, None] * finite_e4m3()[None, :]
    assert np.abs(products).max() == 6 * 448 < 65504
    assert exact_in_f16(products)


def test_bf16_activations_times_2_to_the_minus_8_are_exact_in_f16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7F80) != 0x7F80]  # finite values only
    x = bf16_bits_to_f32(bits).astype(np.float64)
    inside = (np.abs(x) >= 2.0**-6) & (np.abs(x) <= 2.0**23)
    assert exact_in_f16(x[inside] / 256)
    # below 2^-6 the f16 subnormal grid (2^-24 after the scale, 2^-16 before) bounds the error
    small = x[np.abs(x) < 2.0**-6]
    error = np.abs((small / 256).astype(np.float16).astype(np.float64) * 256 - small)
    assert error.max() <= 2.0**-17
