// Launchers of the elementwise kernels (see launchers.h).
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_elementwise.cuh"
#include "backends/cuda/launch_overlapped.h"
#include "backends/cuda/launch_per_row.h"
#include "backends/cuda/launchers.h"

namespace ninfer::cuda {

namespace {

static_assert(32 * kVecRowWarps == kernels::kVecNormThreads);

constexpr int kThreads = 256;
// Grid-stride kernels never need more blocks than this to fill the chip.
constexpr int64_t kMaxStrideBlocks = 132 * 16;

unsigned int stride_blocks(int64_t n) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(kMaxStrideBlocks, (n + kThreads - 1) / kThreads)));
}

template <int kPerThread>
struct RmsNorm {
  static constexpr auto kernel = kernels::rms_norm<kPerThread>;
};

template <int kPerThread>
struct AddRmsNorm {
  static constexpr auto kernel = kernels::add_rms_norm<kPerThread>;
};

template <int kPerWarp>
struct VecRmsNorm {
  static constexpr auto kernel = kernels::vec_rms_norm<kPerWarp, false>;
};

template <int kPerWarp>
struct VecAddRmsNorm {
  static constexpr auto kernel = kernels::vec_rms_norm<kPerWarp, true>;
};

}  // namespace

void launch_f32_to_bf16(const float* x, bf16_bits* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  kernels::f32_to_bf16<<<stride_blocks(n), kThreads, 0, stream>>>(x, y, n);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_random_bf16(bf16_bits* w, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n <= 0) return;
  kernels::random_bf16<<<stride_blocks(n), kThreads, 0, stream>>>(w, n, seed, scale);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_add_bias(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream) {
  if (m * n <= 0) return;
  kernels::add_bias<<<stride_blocks(m * n), kThreads, 0, stream>>>(y, bias, m, n);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_embedding(const bf16_bits* table, int64_t cols, const int32_t* tokens, int64_t n, float* out,
                      cudaStream_t stream) {
  if (n <= 0) return;
  kernels::embedding<<<static_cast<unsigned int>(n), row_threads(cols), 0, stream>>>(table, cols, tokens, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps, float* y,
                     cudaStream_t stream, bool overlap_previous) {
  if (rows <= 0) return;
  if (vec_norm_rows(cols, {x, weight, y}))
    per_vec_row<VecRmsNorm>(rows, cols, overlap_previous, stream, const_cast<float*>(x), nullptr, cols, weight, eps, y);
  else
    per_row<RmsNorm>(rows, cols, overlap_previous, 0, stream, x, cols, weight, eps, y);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm(float* h, const float* branch, int64_t rows, int64_t cols, const float* weight, float eps,
                         float* y, cudaStream_t stream, bool overlap_previous) {
  if (rows <= 0) return;
  if (vec_norm_rows(cols, {h, branch, weight, y}))
    per_vec_row<VecAddRmsNorm>(rows, cols, overlap_previous, stream, h, branch, cols, weight, eps, y);
  else
    per_row<AddRmsNorm>(rows, cols, overlap_previous, 0, stream, h, branch, cols, weight, eps, y);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                 const int32_t* positions, const float* inv_freq, float attention_factor, cudaStream_t stream) {
  if (tokens <= 0 || rotary_dim <= 0) return;
  kernels::rope<<<static_cast<unsigned int>(tokens), row_threads(heads * rotary_dim / 2), 0, stream>>>(
      x, heads, head_dim, rotary_dim / 2, positions, inv_freq, attention_factor);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream,
                   bool overlap_previous) {
  if (n <= 0) return;
  launch_overlapped(overlap_previous, dim3(stride_blocks(n)), dim3(kThreads), 0, stream, kernels::swiglu, gate, up, n,
                    out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  kernels::add<<<stride_blocks(n), kThreads, 0, stream>>>(y, x, n);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const float* src, int64_t cols, const int32_t* rows, int64_t n, float* dst,
                        cudaStream_t stream) {
  if (n <= 0) return;
  kernels::gather_rows<<<static_cast<unsigned int>(n), row_threads(cols), 0, stream>>>(src, cols, rows, dst);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
