// Helpers shared by the kernel files compiled for AVX2 (only included by *_avx2.cpp files).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace ninfer::cpu::avx2 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Prefetches the cache lines of [start, start + bytes) into L2. Prefetches never fault, so running past
// the end of the weights is harmless; the address is formed as an integer for that reason.
inline void prefetch_span(uintptr_t start, int64_t bytes) {
  for (uintptr_t line = start & ~uintptr_t{63}; line < start + static_cast<uintptr_t>(bytes); line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T1);
}

// Software prefetch of the weight rows a fixed distance ahead: rows of a few hundred bytes are
// too short for the hardware prefetcher to lock on, and decode is bound by this stream.
constexpr int64_t kPrefetchBytes = 32 * 1024;

inline int64_t prefetch_distance_rows(int64_t w_row_bytes) {
  return std::max<int64_t>(4, kPrefetchBytes / w_row_bytes / 4 * 4);
}

// The `count` rows starting at `row` when they lie inside this tile's n rows, else 0 (no
// prefetch).
inline uintptr_t rows_ahead(const uint8_t* w, int64_t w_row_bytes, int64_t row, int64_t count, int64_t n) {
  return row + count <= n ? reinterpret_cast<uintptr_t>(w + row * w_row_bytes) : 0;
}

inline float q8_weight_scale(const uint8_t* block) {
  uint16_t bits;
  std::memcpy(&bits, block, 2);
  return _cvtsh_ss(bits);
}

}  // namespace ninfer::cpu::avx2
