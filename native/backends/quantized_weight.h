// FP8 (e4m3, 128×128 block scales) and NVFP4 (e2m1, per-16 e4m3 and per-row f32 scales)
// weights: the views every backend builds over a stored tensor, row slices of them, and the
// host reference decoding (CPU backend, tests, CUDA upload of expert stacks).
#pragma once

#include <cstdint>

#include "artifact/artifact.h"
#include "backends/backend.h"

namespace ninfer {

// A Weight over the stored bytes of an FP8/NVFP4 tensor at `base` (host or device memory),
// viewed as [rows, cols] with `group_rows` rows per matrix (TensorView::group_rows).
Weight quantized_weight_at(DType dtype, int64_t rows, int64_t cols, int64_t group_rows, const void* base);

// Rows [first, first + count) of any weight, as a weight of its own (no copy).
Weight weight_rows(const Weight& w, int64_t first, int64_t count);

float e4m3_to_float(uint8_t code);
float e2m1_to_float(uint8_t code);  // the low 4 bits

// out[i, :] = float32 values of rows [r0, r0 + n) of the FP8/NVFP4 weight `w` (host memory).
void dequantize_rows(const Weight& w, int64_t r0, int64_t n, float* out);

}  // namespace ninfer
