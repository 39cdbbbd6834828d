// Launchers of the FP8 prefill kernels (see launchers_fp8_prefill.h).
#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_fp8_prefill.cuh"
#include "backends/cuda/launch_per_row.h"
#include "backends/cuda/launchers_fp8_prefill.h"

namespace ninfer::cuda {

namespace {

static_assert(32 * kVecRowWarps == kernels::kVecNormThreads);

unsigned int warp_per_group_blocks(const Fp8ActivationSink& sink) {
  if (sink.k % 128 != 0) throw std::invalid_argument("FP8 activations: k must be a multiple of 128");
  return static_cast<unsigned int>((sink.m * (sink.k / 128) + 7) / 8);
}

template <int kPerWarp>
struct AddRmsNormToFp8 {
  static constexpr auto kernel = kernels::add_rms_norm_to_fp8_activations<kPerWarp>;
};

}  // namespace

void launch_quantize_fp8_activations(const float* x, const Fp8ActivationSink& sink, cudaStream_t stream) {
  const unsigned int blocks = warp_per_group_blocks(sink);
  if (sink.m <= 0) return;
  kernels::quantize_fp8_activations<<<blocks, 256, 0, stream>>>(x, sink);
  NINFER_CUDA_CHECK(cudaGetLastError());
}

void launch_swiglu_to_fp8_activations(const float* gate, const float* up, const Fp8ActivationSink& sink,
                                      cudaStream_t stream) {
  const unsigned int blocks = warp_per_group_blocks(sink);
  if (sink.m <= 0) return;
  kernels::swiglu_to_fp8_activations<<<blocks, 256, 0, stream>>>(gate, up, sink);
  NINFER_CUDA_CHECK(cudaGetLastError());
}

bool add_rms_norm_to_fp8_fits(const float* h, const float* branch, const float* weight, const float* y,
                              int64_t cols) {
  return vec_norm_rows(cols, {h, branch, weight, y});
}

void launch_add_rms_norm_to_fp8_activations(float* h, const float* branch, const float* weight, float eps, float* y,
                                            const Fp8ActivationSink& sink, uint16_t* y_bf16, cudaStream_t stream) {
  if (!add_rms_norm_to_fp8_fits(h, branch, weight, y, sink.k))
    throw std::invalid_argument("add_rms_norm_to_fp8: rows of 128-column groups (at most 16384), 16-byte aligned");
  if (sink.m <= 0) return;
  // per_vec_row, as launch_add_rms_norm launches the same rows: the same values, bit for bit.
  per_vec_row<AddRmsNormToFp8>(sink.m, sink.k, false, stream, h, branch, sink.k, weight, eps, y, sink, y_bf16);
  NINFER_CUDA_CHECK(cudaGetLastError());
}

bool gated_rmsnorm_to_fp8_fits(const float* x, const float* z, const float* weight, int64_t dim) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return (dim == 128 || dim == 256 || dim == 512) && aligned(x) && aligned(z) && aligned(weight);
}

void launch_gated_rmsnorm_to_fp8_activations(const float* x, const float* z, int64_t heads, int64_t dim,
                                             const float* weight, float eps, const Fp8ActivationSink& sink,
                                             cudaStream_t stream) {
  if (!gated_rmsnorm_to_fp8_fits(x, z, weight, dim) || heads * dim != sink.k)
    throw std::invalid_argument("gated_rmsnorm_to_fp8_activations: dim 128/256/512, aligned rows, heads·dim = k");
  if (sink.m <= 0) return;
  constexpr int kWarps = 8;
  const auto blocks = static_cast<unsigned int>((sink.m * heads + kWarps - 1) / kWarps);
  if (dim == 128)
    kernels::gated_rmsnorm_to_fp8_activations<1><<<blocks, 32 * kWarps, 0, stream>>>(x, z, heads, weight, eps, sink);
  else if (dim == 256)
    kernels::gated_rmsnorm_to_fp8_activations<2><<<blocks, 32 * kWarps, 0, stream>>>(x, z, heads, weight, eps, sink);
  else
    kernels::gated_rmsnorm_to_fp8_activations<4><<<blocks, 32 * kWarps, 0, stream>>>(x, z, heads, weight, eps, sink);
  NINFER_CUDA_CHECK(cudaGetLastError());
}

void launch_requantize_bf16_to_fp8_blocks(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes, float* scales,
                                          int64_t scale_ld, cudaStream_t stream) {
  if (k % 128 != 0) throw std::invalid_argument("requantize_bf16_to_fp8_blocks: k must be a multiple of 128");
  if (n <= 0) return;
  const dim3 grid(static_cast<unsigned int>(k / 128), static_cast<unsigned int>((n + 127) / 128));
  kernels::requantize_bf16_to_fp8_blocks<<<grid, 256, 0, stream>>>(w, n, k, codes, scales, scale_ld);
  NINFER_CUDA_CHECK(cudaGetLastError());
}

void launch_transpose_to_f32(const void* in, bool bf16, int64_t rows, int64_t cols, float* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32), static_cast<unsigned int>((rows + 31) / 32)),
      block(32, 8);
  if (bf16)
    kernels::transpose_to_f32<<<grid, block, 0, stream>>>(static_cast<const uint16_t*>(in), rows, cols, out);
  else
    kernels::transpose_to_f32<<<grid, block, 0, stream>>>(static_cast<const float*>(in), rows, cols, out);
  NINFER_CUDA_CHECK(cudaGetLastError());
}

void launch_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned int blocks = static_cast<unsigned int>(std::min<int64_t>((n + 255) / 256, 4096));
  kernels::bf16_to_f32<<<blocks, 256, 0, stream>>>(x, y, n);
  NINFER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ninfer::cuda
