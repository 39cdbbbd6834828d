// Host entry points of the FP8 prefill kernels (kernels_fp8_prefill.cuh): activations quantized
// to e4m3 per token and 128-column group, and a bf16 weight re-quantized to e4m3 under
// 128×128 block scales (NVFP4 prefill through the FP8 GEMM). Both follow the converter's rule
// (python/ninfer/artifact/block_quant.py): s = amax / 448 (1 for an all-zero group), code =
// e4m3(v / s) rounded to nearest even and saturated, with IEEE f32 division.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda {

// Where quantized activations go: codes [m, k] (k % 128 == 0) and the scale of (row r,
// 128-column group g) at scales[g * ld + r] for r < ld (the token-major layout cuBLASLt's
// VEC128_32F mode reads) and, when tail_first >= 0, also at
// tail_scales[g * (m - tail_first) + r - tail_first] for r >= tail_first (a second GEMM over the
// last rows, see fp8_block_gemm.h). Fp8BlockGemm::activation_sink hands one out.
struct Fp8ActivationSink {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t ld = 0;
  float* tail_scales = nullptr;
  int64_t tail_first = -1;
  int64_t m = 0, k = 0;
};

// The sink's codes = e4m3 of x [m, k] (f32) under one scale per (row, 128-column group).
void launch_quantize_fp8_activations(const float* x, const Fp8ActivationSink& sink, cudaStream_t stream);

// The same of silu(gate) · up (gate, up [m, k]), computed as launch_swiglu computes it: the
// codes and scales equal launch_quantize_fp8_activations of swiglu's output, bit for bit,
// without that f32 output being written and read back.
void launch_swiglu_to_fp8_activations(const float* gate, const float* up, const Fp8ActivationSink& sink,
                                      cudaStream_t stream);

// Whether launch_add_rms_norm_to_fp8_activations takes these: rows of a whole number of
// 128-column groups (at most 16384 columns), every pointer 16-byte aligned (the rows
// launch_add_rms_norm runs through the same vector kernel).
bool add_rms_norm_to_fp8_fits(const float* h, const float* branch, const float* weight, const float* y, int64_t cols);

// launch_add_rms_norm (h += branch, y = rms_norm(h) over rows of sink.k) that also writes the
// sink's codes and scales of y, bit for bit those of launch_quantize_fp8_activations(y), and,
// when y_bf16 is not null, y in bf16 as launch_f32_to_bf16 writes it; throws unless
// add_rms_norm_to_fp8_fits(sink.k).
void launch_add_rms_norm_to_fp8_activations(float* h, const float* branch, const float* weight, float eps, float* y,
                                            const Fp8ActivationSink& sink, uint16_t* y_bf16, cudaStream_t stream);

// Whether launch_gated_rmsnorm_to_fp8_activations takes these: dim 128, 256 or 512 and x, z,
// weight 16-byte aligned (else the caller takes the f32 norm and the quantizer).
bool gated_rmsnorm_to_fp8_fits(const float* x, const float* z, const float* weight, int64_t dim);

// The same of the GDN output's gated RMSNorm (launch_gated_rmsnorm of x, z [sink.m · heads, dim]
// with dim · heads = sink.k), bit for bit; throws unless gated_rmsnorm_to_fp8_fits.
void launch_gated_rmsnorm_to_fp8_activations(const float* x, const float* z, int64_t heads, int64_t dim,
                                             const float* weight, float eps, const Fp8ActivationSink& sink,
                                             cudaStream_t stream);

// A bf16 [n, k] matrix (k % 128 == 0) as e4m3 codes [n, k] under f32 scales per 128×128
// block, stored [ceil(n / 128), scale_ld] (scale_ld >= k / 128; the padding is left as is).
void launch_requantize_bf16_to_fp8_blocks(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes, float* scales,
                                          int64_t scale_ld, cudaStream_t stream);

// out[c, r] = in[r, c] for in [rows, cols] of f32 (or bf16 bits when bf16): a GEMM whose output
// came out transposed.
void launch_transpose_to_f32(const void* in, bool bf16, int64_t rows, int64_t cols, float* out, cudaStream_t stream);

// y[i] = f32 of the bf16 values x[i] (a GEMM written in bf16 when f32 output is refused).
void launch_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);

}  // namespace ninfer::cuda
