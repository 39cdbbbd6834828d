// AVX-512 VNNI flavour of the Q8_0 matmul (everything else is the AVX2 table). The same
// +128 activation offset as the AVX-VNNI kernel, but one 512-bit vpdpbusd covers two weight
// blocks, which halves the instructions per weight byte in the decode-bound stream.
#include <immintrin.h>

#include "backends/cpu/avx2_helpers.h"
#include "backends/cpu/kernels.h"
#include "common/dtype.h"

namespace ninfer::cpu {

namespace {

using avx2::prefetch_distance_rows;
using avx2::prefetch_span;
using avx2::rows_ahead;

inline uint16_t scale_bits(const uint8_t* block) {
  uint16_t bits;
  std::memcpy(&bits, block, 2);
  return bits;
}

// The 32 quantized bytes of weight blocks b and b + 1 (zeros for b + 1 when `pair` is false).
inline __m512i load_weight_pair(const uint8_t* block, bool pair) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  if (!pair) return _mm512_zextsi256_si512(lo);
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ8BlockBytes + 2));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Both blocks' fp16 scales as floats: lanes 0-7 hold block b's, lanes 8-15 block b + 1's.
inline __m512 weight_scale_pair(const uint8_t* block, bool pair) {
  const int bits = scale_bits(block) | (pair ? static_cast<int>(scale_bits(block + kQ8BlockBytes)) << 16 : 0);
  const __m128 two = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(two));
}

// Activation blocks b and b + 1: their offset bytes and their scales spread like the weights'.
inline void load_act_pair(const BlockQ8Act* x, bool pair, __m512i* q, __m512* s) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[0].q));
  const __m256 s_lo = _mm256_set1_ps(x[0].scale);
  if (!pair) {
    // A zero upper half contributes nothing: zero bytes, and zero weights meet them.
    *q = _mm512_zextsi256_si512(lo);
    *s = _mm512_insertf32x8(_mm512_castps256_ps512(s_lo), _mm256_setzero_ps(), 1);
    return;
  }
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[1].q));
  *q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  *s = _mm512_insertf32x8(_mm512_castps256_ps512(s_lo), _mm256_set1_ps(x[1].scale), 1);
}

template <int R, int C>
void micro_tile(const BlockQ8Act* x, int64_t x_stride, const uint8_t* w, int64_t w_row_bytes, int64_t blocks,
                float* y, int64_t ldy, uintptr_t ahead) {
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool pair = b + 1 < blocks;
    if (ahead) prefetch_span(ahead + static_cast<uintptr_t>(b * C * kQ8BlockBytes), 2 * C * kQ8BlockBytes);
    __m512i xq[R];
    __m512 xs[R];
    for (int r = 0; r < R; ++r) load_act_pair(x + r * x_stride + b, pair, &xq[r], &xs[r]);
    for (int c = 0; c < C; ++c) {
      const uint8_t* block = w + c * w_row_bytes + b * kQ8BlockBytes;
      const __m512i wq = load_weight_pair(block, pair);
      // dot(x + 128, w) - 128 * sum(w) = dot(x, w), lane by lane.
      const __m512i minus_offset =
          _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, wq));
      const __m512 ws = weight_scale_pair(block, pair);
      for (int r = 0; r < R; ++r) {
        const __m512 sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(minus_offset, xq[r], wq));
        acc[r][c] = _mm512_fmadd_ps(sums, _mm512_mul_ps(ws, xs[r]), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
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
// weight block pair over four activation rows.
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

CpuKernels avx512vnni_kernels() {
  // Nothing from the AVX-VNNI table: that file is compiled for the VEX VNNI set, which Zen 4
  // lacks although it has AVX-512 VNNI.
  CpuKernels k = kAvx2Kernels;
  k.name = "avx512vnni";
  k.tile_q8_0 = tile_q8_0;
  k.quantize_row_q8 = quantize_row_q8_offset;  // the +128 offset this kernel expects
  return k;
}

}  // namespace ninfer::cpu
