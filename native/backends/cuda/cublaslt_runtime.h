// cuBLASLt resolved at run time (dlopen), like cublas_runtime.h: the CUDA sources build where
// nvcc exists without cuBLAS (CI) and the binary uses cuBLASLt where the GPU machine has it.
// Only the block-scaled FP8 matmul is wrapped: y[m, n] = x[m, k] · w[n, k]^T with e4m3 codes,
// w under f32 scales per 128×128 block and x under f32 scales per token and 128 columns
// (Qwen's FP8 checkpoint format; CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F and
// VEC128_32F), f32 accumulation with the block scales applied per 128-k step.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>
#include <string>

namespace ninfer::cuda {

// The descriptors and the heuristic's algorithm of one (m, n, k, output type): made once per
// shape; the scale and data pointers are set at every run.
struct LtFp8Plan {
  bool x_first = false;  // x is cuBLASLt's A and w its B: y comes out transposed, [n, m]
  void* desc = nullptr;
  void* layout_w = nullptr;
  void* layout_x = nullptr;
  void* layout_y = nullptr;
  alignas(8) unsigned char algo[64] = {};  // cublasLtMatmulAlgo_t
  size_t workspace = 0;                    // bytes the algorithm needs
};

class CublasLtRuntime {
 public:
  static CublasLtRuntime& get();
  bool available() const { return ok_; }
  const std::string& why() const { return why_; }

  void* create_handle() const;
  void destroy_handle(void* handle) const;

  // Builds the plan; returns "" or why cuBLASLt refused the shape (no algorithm, bad status).
  // Layouts, column-major as cuBLASLt sees the row-major operands: w is A (k × n, op T), x is B
  // (k × m, op N), y is D (n × m, ld n, i.e. row-major [m, n]) of y_type (CUDA_R_32F or
  // CUDA_R_16BF); with x_first, x is A (k × m, op T) and w is B (k × n, op N), and D is m × n
  // (ld m: row-major [n, m], the transpose). Scales, either way: w's [ceil(n / 128),
  // round_up(k / 128, 4)] row-major; x's [k / 128, m] (token-major).
  // `alignment`: the bytes every data pointer of the runs is aligned to (at most 256).
  // `scale_placeholder`: a 256-byte aligned device address set as both scale pointers while
  // the heuristic runs (block-scaled modes are refused with status 7 without them; the runs
  // set the real ones, which must be 256-byte aligned too).
  std::string plan_fp8_block(void* handle, int64_t m, int64_t n, int64_t k, cudaDataType_t y_type, bool x_first,
                             size_t max_workspace, uint32_t alignment, const void* scale_placeholder,
                             LtFp8Plan& plan) const;
  void run_fp8_block(void* handle, LtFp8Plan& plan, const void* w, const float* w_scales, const void* x,
                     const float* x_scales, void* y, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) const;
  void destroy_plan(LtFp8Plan& plan) const;

 private:
  CublasLtRuntime();
  template <typename F>
  bool resolve(F& f, const char* name);

  void* library_ = nullptr;
  bool ok_ = false;
  std::string why_;
  using Create = int (*)(void**);
  using Destroy = int (*)(void*);
  using DescCreate = int (*)(void**, int, cudaDataType_t);
  using SetAttribute = int (*)(void*, int, const void*, size_t);
  using LayoutCreate = int (*)(void**, cudaDataType_t, uint64_t, uint64_t, int64_t);
  using PreferenceCreate = int (*)(void**);
  using Heuristic = int (*)(void*, void*, void*, void*, void*, void*, void*, int, void*, int*);
  using Matmul = int (*)(void*, void*, const void*, const void*, void*, const void*, void*, const void*,
                         const void*, void*, void*, void*, const void*, void*, size_t, cudaStream_t);
  Create create_ = nullptr;
  Destroy destroy_ = nullptr;
  DescCreate desc_create_ = nullptr;
  Destroy desc_destroy_ = nullptr;
  SetAttribute desc_set_ = nullptr;
  LayoutCreate layout_create_ = nullptr;
  Destroy layout_destroy_ = nullptr;
  PreferenceCreate pref_create_ = nullptr;
  Destroy pref_destroy_ = nullptr;
  SetAttribute pref_set_ = nullptr;
  Heuristic heuristic_ = nullptr;
  Matmul matmul_ = nullptr;
};

}  // namespace ninfer::cuda
