// Portable kernels: plain C++ that the compiler may vectorize with the baseline ISA.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/float_convert.h"
#include "backends/cpu/kernels.h"
#include "common/dtype.h"

namespace ninfer::cpu {

namespace {

constexpr int kLanes = 8;  // independent partial sums, so the loop can be vectorized

template <typename Load>
float dot_with(const float* x, const Load& load_w, int64_t k) {
  float partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes)
    for (int l = 0; l < kLanes; ++l) partial[l] += x[i + l] * load_w(i + l);
  float sum = 0.0f;
  for (; i < k; ++i) sum += x[i] * load_w(i);
  for (float p : partial) sum += p;
  return sum;
}

template <typename Element, float (*convert)(Element)>
void tile_generic(const float* x, int64_t x_stride, int64_t m, const void* w, int64_t w_row_bytes,
                  int64_t n, int64_t k, float* y, int64_t ldy) {
  for (int64_t j = 0; j < n; ++j) {
    const auto* row = reinterpret_cast<const Element*>(static_cast<const uint8_t*>(w) + j * w_row_bytes);
    for (int64_t i = 0; i < m; ++i)
      y[i * ldy + j] = dot_with(x + i * x_stride, [row](int64_t c) { return convert(row[c]); }, k);
  }
}

float identity(float v) { return v; }

void tile_f32(const float* x, int64_t xs, int64_t m, const void* w, int64_t wb, int64_t n,
              int64_t k, float* y, int64_t ldy) {
  tile_generic<float, identity>(x, xs, m, w, wb, n, k, y, ldy);
}
void tile_f16(const float* x, int64_t xs, int64_t m, const void* w, int64_t wb, int64_t n,
              int64_t k, float* y, int64_t ldy) {
  tile_generic<uint16_t, f16_to_f32>(x, xs, m, w, wb, n, k, y, ldy);
}
void tile_bf16(const float* x, int64_t xs, int64_t m, const void* w, int64_t wb, int64_t n,
               int64_t k, float* y, int64_t ldy) {
  tile_generic<uint16_t, bf16_to_f32>(x, xs, m, w, wb, n, k, y, ldy);
}

void tile_q8_0(const BlockQ8Act* x, int64_t x_stride_blocks, int64_t m, const void* w,
               int64_t w_row_bytes, int64_t n, int64_t k, float* y, int64_t ldy) {
  const int64_t blocks = k / kQ8BlockSize;
  for (int64_t j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(w) + j * w_row_bytes;
    for (int64_t i = 0; i < m; ++i) {
      const BlockQ8Act* xb = x + i * x_stride_blocks;
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* wb = row + b * kQ8BlockBytes;
        uint16_t scale_bits;
        std::memcpy(&scale_bits, wb, 2);
        const auto* wq = reinterpret_cast<const int8_t*>(wb + 2);
        int32_t acc = 0;
        for (int l = 0; l < 32; ++l) acc += static_cast<int32_t>(wq[l]) * xb[b].q[l];
        sum += static_cast<float>(acc) * (f16_to_f32(scale_bits) * xb[b].scale);
      }
      y[i * ldy + j] = sum;
    }
  }
}

void quantize_row_q8(const float* x, int64_t k, BlockQ8Act* out) {
  for (int64_t b = 0; b < k / kQ8BlockSize; ++b) {
    const float* v = x + b * kQ8BlockSize;
    float amax = 0.0f;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(v[l]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    out[b].scale = amax / 127.0f;
    for (int l = 0; l < 32; ++l) out[b].q[l] = static_cast<int8_t>(std::nearbyint(v[l] * inv));
  }
}

void gemm_accumulate(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n, int64_t k,
                     float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < k; ++t) {
      const float at = a[i * lda + t];
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] += at * b[t * ldb + j];
    }
}

float exp_shifted_sum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

float dot(const float* a, const float* b, int64_t n) {
  return dot_with(a, [b](int64_t c) { return b[c]; }, n);
}

void scale_add(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace

const CpuKernels kScalarKernels = {
    "scalar", tile_f32, tile_f16, tile_bf16, tile_q8_0, quantize_row_q8, gemm_accumulate, exp_shifted_sum, dot, scale_add, scale,
};

}  // namespace ninfer::cpu
