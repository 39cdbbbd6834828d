// Prefill matmuls of FP8 weights on the tensor cores: the activations are quantized to e4m3
// per token and 128 columns (W8A8), then cuBLASLt's block-scaled GEMM (weights under their
// stored 128×128 block scales) writes f32. NVFP4 weights can take the same path after a
// re-quantization into 128×128 FP8 blocks (lossy: e4m3 keeps 4 significant bits of the
// e2m1·scale products' up to 6; opt-in, see docs/artifact-format.md).
//
// The weight is cuBLASLt's A operand (BLK128x128) and x its B (VEC128), so y comes out
// row-major; should that pairing be refused, x as A is tried, its transposed output staged and
// turned. cuBLASLt's block-scaled modes need at least 16 rows and a token count that keeps the
// token-major activation scales 16-byte aligned (a multiple of 4): the first m & ~3 rows go
// through one GEMM and, when m % 4 != 0, a second 16-row GEMM covers the last 16 rows
// (rewriting up to 12 of them with the same values). Plans (descriptors and the heuristic's
// algorithm) are cached per shape; the weight scales are copied once into the padded layout
// cuBLASLt reads when their row of K blocks is not a multiple of 4.
//
// Reusable outside the dense path (MoE expert slices): a Weight whose rows are a whole number
// of 128-row blocks inside one matrix of its stack is accepted as is.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cublaslt_runtime.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/launchers_fp8_prefill.h"

namespace ninfer::cuda {

// How NVFP4 weights run prefill matmuls: "bf16" (dequantized to bf16, bf16 cuBLAS GEMM: exact,
// the default) or "fp8" (re-quantized to FP8 blocks, this GEMM). NINFER_NVFP4_PREFILL, read at
// every call so a benchmark can time both in one process.
bool nvfp4_prefill_via_fp8();
// True unless NINFER_FP8_GEMM=0, which sends FP8 weights' prefill through the bf16 dequantize
// + cuBLAS path (W8A16) instead of this GEMM (W8A8).
bool fp8_gemm_enabled();
// True unless NINFER_FP8_FUSED=0: the kernels that compute an MLP's SwiGLU and the GDN output's
// gated norm write this GEMM's e4m3 operand themselves (bit for bit what the quantizer writes
// for their f32 output, which is then skipped); 0 runs them and the quantizer apart (tests,
// benchmarks).
bool fp8_fused_producers_enabled();

class Fp8BlockGemm {
 public:
  explicit Fp8BlockGemm(cudaStream_t stream);
  ~Fp8BlockGemm();
  Fp8BlockGemm(const Fp8BlockGemm&) = delete;
  Fp8BlockGemm& operator=(const Fp8BlockGemm&) = delete;

  // cuBLASLt loaded (else why()).
  static bool available();
  static const std::string& why();

  // Whether matmul() can take w for m rows (checked before quantizing anything): an FP8 (or,
  // with nvfp4, an NVFP4) weight, k % 128 == 0, rows % 4 == 0, m >= 16, block-aligned rows.
  static bool accepts(const Weight& w, int64_t m, bool nvfp4);

  // Quantizes x [m, k] (f32) for the matmuls that follow; all of them read this x.
  void quantize_activations(const float* x, int64_t m, int64_t k);
  // Where a producer kernel writes the activations [m, k] of the matmuls that follow instead
  // (launchers_fp8_prefill.h); they read it once the producer has run on this stream.
  Fp8ActivationSink activation_sink(int64_t m, int64_t k);
  // y[m, w.rows] = x · w^T (f32, no bias) with the last quantized x; false (nothing written)
  // when cuBLASLt has no algorithm for the shape, and the caller takes another path.
  bool matmul(const Weight& w, float* y);
  // Why the last refused matmul() was refused.
  const std::string& refusal() const { return refusal_; }

  // Device views of the last quantize_activations (tests): codes [m, k], scales [k/128, m & ~3].
  const uint8_t* activation_codes() const { return x_codes_; }
  const float* activation_scales() const { return x_scales_; }
  // ... and, when m % 4 != 0, those of the last 16 rows: [k/128, 16].
  const float* tail_activation_scales() const { return tail_scales_; }
  // The FP8 form of an NVFP4 weight as matmul() makes it (tests): codes [rows, k] and scales
  // [ceil(rows / 128), round_up(k / 128, 4)], valid until the next call.
  std::pair<const uint8_t*, const float*> requantize(const Weight& nvfp4_weight);
  // Drops the cached padded weight scales (their weights are gone).
  void forget_weights();
  // Tests: plan only the x-as-A pairing (the fallback when the weight-as-A one is refused).
  void force_x_first(bool on) { force_x_first_ = on; }

 private:
  struct Plan {
    LtFp8Plan lt;
    cudaDataType_t y_type = CUDA_R_32F;
    std::string refused;  // non-empty: no algorithm for either output type
  };
  Plan& plan(int64_t m, int64_t n, int64_t k, uint32_t alignment);
  const float* weight_scales(const Weight& w);
  // (rows, pointer alignment) of the GEMMs of one matmul (see the header comment).
  std::vector<std::pair<int64_t, uint32_t>> gemms(const void* w_codes, const float* y, int64_t n) const;
  void run(const uint8_t* w_codes, const float* w_scales, int64_t n, float* y);

  cudaStream_t stream_;
  void* handle_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, uint32_t>, Plan> plans_;
  std::map<std::pair<const void*, int64_t>, float*> padded_scales_;
  DeviceScratch workspace_, x_codes_buf_, x_scales_buf_, tail_scales_buf_, w_bf16_, w_codes_, w_scales_, y_staged_;
  const uint8_t* x_codes_ = nullptr;
  const float* x_scales_ = nullptr;
  const float* tail_scales_ = nullptr;
  int64_t m_ = 0, k_ = 0;
  std::string refusal_;
  bool force_x_first_ = false;
};

}  // namespace ninfer::cuda
