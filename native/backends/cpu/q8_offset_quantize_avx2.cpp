// The +128-offset activation quantization that both VNNI Q8_0 kernels (AVX-VNNI and AVX-512
// VNNI) read. It lives in a plain AVX2 file, not in the AVX-VNNI one, so that the AVX-512
// table runs on CPUs with AVX-512 VNNI but without the VEX AVX-VNNI set (AMD Zen 4).
#include <immintrin.h>

#include "backends/cpu/kernels.h"
#include "common/dtype.h"

namespace ninfer::cpu {

// The AVX2 quantization, then the +128 offset (a sign-bit flip) that vpdpbusd needs.
void quantize_row_q8_offset(const float* x, int64_t k, BlockQ8Act* out) {
  kAvx2Kernels.quantize_row_q8(x, k, out);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < k / kQ8BlockSize; ++b) {
    auto* q = reinterpret_cast<__m256i*>(out[b].q);
    _mm256_storeu_si256(q, _mm256_xor_si256(_mm256_loadu_si256(q), flip));
  }
}

}  // namespace ninfer::cpu
