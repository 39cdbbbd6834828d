// Inner kernels of the CPU backend, in a portable and an AVX2/FMA flavour.
//
// The backend calls them through the table that `cpu_kernels()` returns, which is chosen once
// from the CPU's features; tests can force the portable table to check both paths.
#pragma once

#include <cstdint>
#include <string_view>

namespace ninfer::cpu {

// An activation row quantized for int8 dot products with Q8_0 weights: 32 values per block,
// float32 scale (the weights keep their fp16 scale).
struct BlockQ8Act {
  float scale;
  int8_t q[32];
};

// Computes y[i * ldy + j] = dot(x row i, w row j) for i < m, j < n over k elements.
// x rows are `x_stride` elements apart (BlockQ8Act blocks for q8_0), w rows `w_row_bytes` apart.
using MatmulTileF32 = void (*)(const float* x, int64_t x_stride, int64_t m, const void* w,
                               int64_t w_row_bytes, int64_t n, int64_t k, float* y, int64_t ldy);
using MatmulTileQ8 = void (*)(const BlockQ8Act* x, int64_t x_stride_blocks, int64_t m,
                              const void* w, int64_t w_row_bytes, int64_t n, int64_t k, float* y,
                              int64_t ldy);

struct CpuKernels {
  std::string_view name;
  MatmulTileF32 tile_f32;
  MatmulTileF32 tile_f16;
  MatmulTileF32 tile_bf16;
  MatmulTileQ8 tile_q8_0;
  void (*quantize_row_q8)(const float* x, int64_t k, BlockQ8Act* out);  // k % 32 == 0
  // c[i * ldc + j] += sum_t a[i * lda + t] * b[t * ldb + j] for i < m, j < n, t < k.
  void (*gemm_accumulate)(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n,
                          int64_t k, float* c, int64_t ldc);
  // x[i] = exp(x[i] - shift) for i < n (inputs <= shift); returns the sum of the results.
  float (*exp_shifted_sum)(float* x, int64_t n, float shift);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*scale_add)(float* y, const float* x, float a, int64_t n);  // y = y + a * x
  void (*scale)(float* y, float a, int64_t n);                      // y = a * y
};

extern const CpuKernels kScalarKernels;
#if NINFER_HAVE_AVX2_KERNELS
extern const CpuKernels kAvx2Kernels;
CpuKernels avxvnni_kernels();  // kAvx2Kernels with the AVX-VNNI int8 matmul
// kAvx2Kernels' activation quantization plus the +128 offset the VNNI matmuls expect (AVX2 only).
void quantize_row_q8_offset(const float* x, int64_t k, BlockQ8Act* out);
#endif
#if NINFER_HAVE_AVX512_KERNELS
// kAvx2Kernels with the offset quantization and a 512-bit VNNI int8 matmul; needs AVX-512
// F/BW/DQ/VL/VNNI but not AVX-VNNI (so Zen 4 runs it).
CpuKernels avx512vnni_kernels();
#endif

// CPU features that decide the kernel set, and the set they select ("avx512vnni", "avxvnni",
// "avx2" or "scalar"): the fastest one the features allow (pure, so tests can check a CPU
// they do not run on).
struct CpuFeatures {
  bool avx2_fma_f16c = false;
  bool avxvnni = false;
  bool avx512_f_bw_dq_vl_vnni = false;
};
CpuFeatures detect_cpu_features();
std::string_view best_kernel_name(const CpuFeatures& features);

// The active table. Initially `best_kernel_name(detect_cpu_features())` among the sets this
// build has, unless NINFER_CPU_KERNELS names one; `select_cpu_kernels` switches it ("auto",
// "scalar", "avx2", "avxvnni" or "avx512vnni"; throws for a name this build or CPU cannot run).
const CpuKernels& cpu_kernels();
void select_cpu_kernels(std::string_view name);

}  // namespace ninfer::cpu
