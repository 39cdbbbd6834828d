"""The hand bf16 GEMV (every kernel variant) against a float64 reference on fresh random inputs.

x is f32 [m, k] and rounded to bf16 by the kernel (as on the cuBLAS path), weights are bf16,
products accumulate in f32: the reference uses the same bf16 operands in float64, so only the
summation order differs. Outputs are poisoned (NaN) before each launch, or hold random values
that the accumulating form must add to; the binding also checks a guard region past every
output for stray writes. GPU machine only.
"""

from __future__ import annotations

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import bf16_bits_to_f32, f32_to_bf16_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

AUTO = -1
K_VALUES = [5120, 6144, 17408, 40]  # the 27B widths and a small odd multiple of 8
ODD_ROWS = [37, 1, 203]


@pytest.fixture(scope="module")
def gemv():
    return _core.CudaGemv(0)


def rng_for(*key: int) -> np.random.Generator:
    return np.random.default_rng([20261129, 17, *key])


def bf16_round(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32)))


def run_case(gemv, m, k, rows_list, variants, *, accumulate=False, with_bias=True):
    """Every variant in `variants` on the same fresh inputs."""
    rng = rng_for(m, k, len(rows_list), int(accumulate), *rows_list)
    x = rng.standard_normal((m, k), dtype=np.float32)
    ws = [f32_to_bf16_bits(rng.standard_normal((r, k), dtype=np.float32)) for r in rows_list]
    biases = [rng.standard_normal(r, dtype=np.float32) if with_bias and i % 2 == 0 else None
              for i, r in enumerate(rows_list)]
    x64 = bf16_round(x).astype(np.float64)
    refs = []
    for w, b in zip(ws, biases, strict=True):
        ref = x64 @ bf16_bits_to_f32(w).astype(np.float64).T
        refs.append(ref if b is None else ref + b)
    tolerance = 1e-5 * max(1.0, np.sqrt(k / 1024))
    for variant in variants:
        if accumulate:
            outs = [rng.standard_normal((m, r), dtype=np.float32) for r in rows_list]
        else:
            outs = [np.full((m, r), np.nan, dtype=np.float32) for r in rows_list]
        before = [o.astype(np.float64) for o in outs]
        gemv.gemv(x, ws, outs, biases, accumulate, variant)
        for out, ref, old in zip(outs, refs, before, strict=True):
            want = ref + old if accumulate else ref
            assert np.all(np.isfinite(out)), f"variant {variant}: unwritten or non-finite outputs"
            err = np.abs(out - want).max() / max(np.abs(want).max(), 1e-30)
            assert err < tolerance, (m, k, out.shape, variant, err)


def mma_variants(gemv) -> list[int]:
    """The default and every variant that supports accumulation (all but the legacy kernel)."""
    return [AUTO, *(i for i, name in enumerate(gemv.variants()) if not name.startswith("legacy"))]


def test_variants_are_listed(gemv):
    names = gemv.variants()
    assert len(names) >= 2 and all(isinstance(n, str) and n for n in names)


@pytest.mark.parametrize("k", K_VALUES)
@pytest.mark.parametrize("m", list(range(1, 17)))
def test_default_gemv_every_m(gemv, m, k):
    run_case(gemv, m, k, [ODD_ROWS[m % 3]], [AUTO])


@pytest.mark.parametrize("k", K_VALUES)
@pytest.mark.parametrize("m", [1, 4, 8, 9, 16])
def test_every_variant(gemv, m, k):
    run_case(gemv, m, k, [ODD_ROWS[(m + k) % 3], 16], range(len(gemv.variants())))


@pytest.mark.parametrize("m", [1, 3, 8, 13])
def test_job_table_of_four_weights(gemv, m):
    # GDN in_proj-like: two large weights and two tiny ones of the same width in one launch.
    run_case(gemv, m, 5120 if m < 8 else 40, [517, 261, 48, 5], mma_variants(gemv))


@pytest.mark.parametrize("m", [1, 2, 7, 16])
@pytest.mark.parametrize("k", [6144, 17408, 40])
def test_accumulate_adds_to_the_output(gemv, m, k):
    run_case(gemv, m, k, [ODD_ROWS[m % 3], 64], mma_variants(gemv), accumulate=True)


@pytest.mark.parametrize("m,rows,k", [(1, 5120, 6144), (4, 2061, 5120), (16, 517, 17408)])
def test_real_widths_with_many_rows(gemv, m, rows, k):
    # Hundreds of tiles over thousands of warps: whole tiles and tiles shared between warps.
    run_case(gemv, m, k, [rows], mma_variants(gemv), with_bias=False)


def test_overlapped_launch(gemv):
    # Launched with programmatic stream serialization, as the backend does in decode steps.
    rng = rng_for(5)
    x = rng.standard_normal((3, 5120), dtype=np.float32)
    w = f32_to_bf16_bits(rng.standard_normal((300, 5120), dtype=np.float32))
    plain = np.full((3, 300), np.nan, dtype=np.float32)
    overlapped = plain.copy()
    gemv.gemv(x, [w], [plain], [None], False, AUTO)
    gemv.gemv(x, [w], [overlapped], [None], False, AUTO, overlap=True)
    np.testing.assert_array_equal(plain, overlapped)


def test_results_are_deterministic(gemv):
    rng = rng_for(99)
    x = rng.standard_normal((4, 17408), dtype=np.float32)
    w = f32_to_bf16_bits(rng.standard_normal((300, 17408), dtype=np.float32))
    first = np.full((4, 300), np.nan, dtype=np.float32)
    second = first.copy()
    gemv.gemv(x, [w], [first], [None], False, AUTO)
    gemv.gemv(x, [w], [second], [None], False, AUTO)
    np.testing.assert_array_equal(first, second)


def test_rejects_unsupported_shapes(gemv):
    x = np.zeros((17, 64), np.float32)
    w = np.zeros((8, 64), np.uint16)
    with pytest.raises(ValueError, match="unsupported"):
        gemv.gemv(x, [w], [np.zeros((17, 8), np.float32)], [None], False, AUTO)
    x = np.zeros((1, 12), np.float32)
    w = np.zeros((8, 12), np.uint16)
    with pytest.raises(ValueError, match="unsupported"):
        gemv.gemv(x, [w], [np.zeros((1, 8), np.float32)], [None], False, AUTO)
