// AVX-VNNI flavour of the Q8_0 matmul (everything else is the AVX2 table). vpdpbusd multiplies
// unsigned by signed bytes, so activations are stored offset by +128 and the offset's share,
// 128 * sum(w), is subtracted once per weight block: one instruction per block pair instead
// of the sign/maddubs/madd sequence.
#pragma GCC target("avxvnni")

#include <immintrin.h>

#include "backends/cpu/avx2_helpers.h"
#include "backends/cpu/kernels.h"
#include "common/dtype.h"

namespace ninfer::cpu {

namespace {

using namespace avx2;

template <int R, int C>
void micro_tile(const BlockQ8Act* x, int64_t x_stride, const uint8_t* w, int64_t w_row_bytes, int64_t blocks,
                float* y, int64_t ldy, uintptr_t ahead) {
  const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    if (ahead) prefetch_span(ahead + static_cast<uintptr_t>(b * C * kQ8BlockBytes), C * kQ8BlockBytes);
    __m256i xq[R];
    float xs[R];
    for (int r = 0; r < R; ++r) {
      xq[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r * x_stride + b].q));
      xs[r] = x[r * x_stride + b].scale;
    }
    for (int c = 0; c < C; ++c) {
      const uint8_t* block = w + c * w_row_bytes + b * kQ8BlockBytes;
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
      const __m256i minus_offset =
          _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), offset, wq));
      const float ws = q8_weight_scale(block);
      for (int r = 0; r < R; ++r) {
        const __m256 sums = _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(minus_offset, xq[r], wq));
        acc[r][c] = _mm256_fmadd_ps(sums, _mm256_set1_ps(ws * xs[r]), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = hsum(acc[r][c]);
}

template <int R, int C>
void tile_rows(const BlockQ8Act* x, int64_t x_stride, const uint8_t* w, int64_t w_row_bytes, int64_t n,
               int64_t blocks, float* y, int64_t ldy) {
  int64_t j = 0;
  const int64_t distance = prefetch_distance_rows(w_row_bytes);
  for (; j + C <= n; j += C)
    micro_tile<R, C>(x, x_stride, w + j * w_row_bytes, w_row_bytes, blocks, y + j, ldy,
                     rows_ahead(w, w_row_bytes, j + distance, C, n));
  for (; j < n; ++j) micro_tile<R, 1>(x, x_stride, w + j * w_row_bytes, w_row_bytes, blocks, y + j, ldy, 0);
}

// Decode (one or two rows) streams the weights four rows at a time; prefill reuses each
// weight block over four activation rows, which halves the per-block weight work.
void tile_q8_0(const BlockQ8Act* x, int64_t x_stride, int64_t m, const void* w, int64_t w_row_bytes, int64_t n,
               int64_t k, float* y, int64_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t blocks = k / kQ8BlockSize;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    tile_rows<4, 2>(x + i * x_stride, x_stride, wb, w_row_bytes, n, blocks, y + i * ldy, ldy);
  for (; i + 2 <= m; i += 2)
    tile_rows<2, 4>(x + i * x_stride, x_stride, wb, w_row_bytes, n, blocks, y + i * ldy, ldy);
  for (; i < m; ++i) tile_rows<1, 4>(x + i * x_stride, x_stride, wb, w_row_bytes, n, blocks, y + i * ldy, ldy);
}

}  // namespace

CpuKernels avxvnni_kernels() {
  CpuKernels k = kAvx2Kernels;
  k.name = "avxvnni";
  k.tile_q8_0 = tile_q8_0;
  k.quantize_row_q8 = quantize_row_q8_offset;
  return k;
}

}  // namespace ninfer::cpu
