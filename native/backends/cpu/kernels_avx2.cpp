// AVX2/FMA kernels; this file is compiled with -mavx2 -mfma -mf16c and only called after
// the dispatcher has checked that the CPU supports those extensions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/avx2_helpers.h"
#include "backends/cpu/float_convert.h"
#include "backends/cpu/kernels.h"
#include "common/dtype.h"

namespace ninfer::cpu {

namespace {

using namespace avx2;

// Loads 8 weights as float32, and converts one weight for the k % 8 tail.
// kPrefetch: whether software prefetch paid off in measurements (f32 rows are long enough
// for the hardware prefetcher, and the extra instructions cost more than they save).
struct F32Weights {
  using Element = float;
  static constexpr bool kPrefetch = false;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  static float one(const float* p) { return *p; }
};
struct F16Weights {
  using Element = uint16_t;
  static constexpr bool kPrefetch = true;
  static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float one(const uint16_t* p) { return f16_to_f32(*p); }
};
struct BF16Weights {
  using Element = uint16_t;
  static constexpr bool kPrefetch = true;
  static __m256 load8(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static float one(const uint16_t* p) { return bf16_to_f32(*p); }
};

// R x-rows times C w-rows of dot products, kept in R*C vector accumulators.
template <typename W, int R, int C>
void micro_tile(const float* x, int64_t x_stride, const uint8_t* w, int64_t w_row_bytes, int64_t k,
                float* y, int64_t ldy, uintptr_t ahead) {
  using E = typename W::Element;
  const E* wr[C];
  for (int c = 0; c < C; ++c) wr[c] = reinterpret_cast<const E*>(w + c * w_row_bytes);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t ahead_step = C * static_cast<int64_t>(sizeof(E)) * 8;
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    if (ahead) prefetch_span(ahead + static_cast<uintptr_t>((i / 8) * ahead_step), ahead_step);
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * x_stride + i);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = W::load8(wr[c] + i);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float sum = hsum(acc[r][c]);
      for (int64_t t = i; t < k; ++t) sum += x[r * x_stride + t] * W::one(wr[c] + t);
      y[r * ldy + c] = sum;
    }
}

template <typename W, int R>
void tile_rows(const float* x, int64_t x_stride, const uint8_t* w, int64_t w_row_bytes, int64_t n,
               int64_t k, float* y, int64_t ldy) {
  int64_t j = 0;
  const int64_t distance = prefetch_distance_rows(w_row_bytes);
  for (; j + 4 <= n; j += 4)
    micro_tile<W, R, 4>(x, x_stride, w + j * w_row_bytes, w_row_bytes, k, y + j, ldy,
                        W::kPrefetch ? rows_ahead(w, w_row_bytes, j + distance, 4, n) : 0);
  for (; j < n; ++j) micro_tile<W, R, 1>(x, x_stride, w + j * w_row_bytes, w_row_bytes, k, y + j, ldy, 0);
}

template <typename W>
void tile_float(const float* x, int64_t x_stride, int64_t m, const void* w, int64_t w_row_bytes,
                int64_t n, int64_t k, float* y, int64_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  int64_t i = 0;
  for (; i + 2 <= m; i += 2) tile_rows<W, 2>(x + i * x_stride, x_stride, wb, w_row_bytes, n, k, y + i * ldy, ldy);
  for (; i < m; ++i) tile_rows<W, 1>(x + i * x_stride, x_stride, wb, w_row_bytes, n, k, y + i * ldy, ldy);
}

// Signed int8 dot product of 32 pairs as 8 int32 partial sums (maddubs needs one unsigned
// operand, so move w's sign onto x).
inline __m256i dot_i8(__m256i w_abs, __m256i w, __m256i x) {
  const __m256i products = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(products, _mm256_set1_epi16(1));
}

template <int R, int C>
void micro_tile_q8(const BlockQ8Act* x, int64_t x_stride, const uint8_t* w, int64_t w_row_bytes,
                   int64_t blocks, float* y, int64_t ldy, uintptr_t ahead) {
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
      const __m256i w_abs = _mm256_sign_epi8(wq, wq);
      const float ws = q8_weight_scale(block);
      for (int r = 0; r < R; ++r) {
        const __m256 sums = _mm256_cvtepi32_ps(dot_i8(w_abs, wq, xq[r]));
        acc[r][c] = _mm256_fmadd_ps(sums, _mm256_set1_ps(ws * xs[r]), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = hsum(acc[r][c]);
}

template <int R, int C>
void tile_rows_q8(const BlockQ8Act* x, int64_t x_stride, const uint8_t* w, int64_t w_row_bytes,
                  int64_t n, int64_t blocks, float* y, int64_t ldy) {
  int64_t j = 0;
  const int64_t distance = prefetch_distance_rows(w_row_bytes);
  for (; j + C <= n; j += C)
    micro_tile_q8<R, C>(x, x_stride, w + j * w_row_bytes, w_row_bytes, blocks, y + j, ldy,
                        rows_ahead(w, w_row_bytes, j + distance, C, n));
  for (; j < n; ++j) micro_tile_q8<R, 1>(x, x_stride, w + j * w_row_bytes, w_row_bytes, blocks, y + j, ldy, 0);
}

void tile_q8_0(const BlockQ8Act* x, int64_t x_stride, int64_t m, const void* w, int64_t w_row_bytes,
               int64_t n, int64_t k, float* y, int64_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t blocks = k / kQ8BlockSize;
  int64_t i = 0;
  for (; i + 2 <= m; i += 2)  // 4x2 tiles measured no faster here than 2x4
    tile_rows_q8<2, 4>(x + i * x_stride, x_stride, wb, w_row_bytes, n, blocks, y + i * ldy, ldy);
  for (; i < m; ++i) tile_rows_q8<1, 4>(x + i * x_stride, x_stride, wb, w_row_bytes, n, blocks, y + i * ldy, ldy);
}

void quantize_row_q8(const float* x, int64_t k, BlockQ8Act* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / kQ8BlockSize; ++b) {
    const float* v = x + b * kQ8BlockSize;
    __m256 part[4];
    __m256 amax = _mm256_setzero_ps();
    for (int p = 0; p < 4; ++p) {
      part[p] = _mm256_loadu_ps(v + 8 * p);
      amax = _mm256_max_ps(amax, _mm256_and_ps(part[p], abs_mask));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float max_abs = _mm_cvtss_f32(m4);
    const float inv = max_abs > 0.0f ? 127.0f / max_abs : 0.0f;
    out[b].scale = max_abs / 127.0f;
    __m256i q[4];
    for (int p = 0; p < 4; ++p) {
      const __m256 scaled = _mm256_mul_ps(part[p], _mm256_set1_ps(inv));
      q[p] = _mm256_cvtps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i lo = _mm256_packs_epi32(q[0], q[1]);
    const __m256i hi = _mm256_packs_epi32(q[2], q[3]);
    const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(lo, hi), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q), packed);
  }
}

// R rows of c, columns [j, j + 8 * V), accumulated in registers over k.
template <int R, int V>
void gemm_block(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float* c, int64_t ldc) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_loadu_ps(c + r * ldc + 8 * v);
  for (int64_t t = 0; t < k; ++t) {
    __m256 bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm256_loadu_ps(b + t * ldb + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + t);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
}

template <int R>
void gemm_rows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t n, int64_t k, float* c,
               int64_t ldc) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) gemm_block<R, 2>(a, lda, b + j, ldb, k, c + j, ldc);
  for (; j + 8 <= n; j += 8) gemm_block<R, 1>(a, lda, b + j, ldb, k, c + j, ldc);
  for (; j < n; ++j)
    for (int r = 0; r < R; ++r) {
      float sum = c[r * ldc + j];
      for (int64_t t = 0; t < k; ++t) sum += a[r * lda + t] * b[t * ldb + j];
      c[r * ldc + j] = sum;
    }
}

void gemm_accumulate(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n, int64_t k,
                     float* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) gemm_rows<4>(a + i * lda, lda, b, ldb, n, k, c + i * ldc, ldc);
  for (; i < m; ++i) gemm_rows<1>(a + i * lda, lda, b, ldb, n, k, c + i * ldc, ldc);
}

// exp(x) for x <= 0 to ~2 ulp: x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial for
// e^r, then n added to the exponent. Inputs below -87 flush towards zero.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 split in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

float exp_shifted_sum(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void scale_add(float* y, const float* x, float a, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void scale(float* y, float a, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= a;
}

}  // namespace

const CpuKernels kAvx2Kernels = {
    "avx2",
    tile_float<F32Weights>,
    tile_float<F16Weights>,
    tile_float<BF16Weights>,
    tile_q8_0,
    quantize_row_q8,
    gemm_accumulate,
    exp_shifted_sum,
    dot,
    scale_add,
    scale,
};

}  // namespace ninfer::cpu
