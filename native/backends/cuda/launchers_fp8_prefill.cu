// Launchers of the FP8 prefill kernels (see launchers_fp8_prefill.h).
#include <algorithm>
#include <stdexcept>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_fp8_prefill.cuh"
#include "backends/cuda/launchers_fp8_prefill.h"

namespace ninfer::cuda {

void launch_quantize_fp8_activations(const float* x, int64_t m, int64_t k, uint8_t* codes, float* scales,
                                     int64_t ld, float* tail_scales, int64_t tail_first, cudaStream_t stream) {
  if (k % 128 != 0) throw std::invalid_argument("quantize_fp8_activations: k must be a multiple of 128");
  if (m <= 0) return;
  const int64_t warps = m * (k / 128);
  const unsigned int blocks = static_cast<unsigned int>((warps + 7) / 8);
  kernels::quantize_fp8_activations<<<blocks, 256, 0, stream>>>(x, m, k, codes, scales, ld, tail_scales, tail_first);
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
