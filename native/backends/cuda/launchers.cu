// Launchers of the elementwise and GEMV kernels (see launchers.h).
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_elementwise.cuh"
#include "backends/cuda/kernels_gemv.cuh"
#include "backends/cuda/launchers.h"

namespace ninfer::cuda {

namespace {

constexpr int kThreads = 256;
// Grid-stride kernels never need more blocks than this to fill the chip.
constexpr int64_t kMaxStrideBlocks = 132 * 16;

unsigned int stride_blocks(int64_t n) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(kMaxStrideBlocks, (n + kThreads - 1) / kThreads)));
}

int row_threads(int64_t cols) { return cols >= 1024 ? 1024 : (cols >= 256 ? 256 : 128); }

template <int M>
void gemv_for(const kernels::GemvJobTable& table, const float* x, int k, cudaStream_t stream) {
  const int warps = table.first_warp[table.num_jobs];
  const int blocks = (warps + kernels::kGemvWarpsPerBlock - 1) / kernels::kGemvWarpsPerBlock;
  kernels::gemv_bf16<M><<<blocks, kernels::kGemvWarpsPerBlock * 32, 0, stream>>>(table, x, k);
}

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

void launch_gemv_bf16(const GemvJob* jobs, int num_jobs, const float* x, int m, int k, cudaStream_t stream) {
  if (num_jobs < 1 || num_jobs > kGemvMaxJobs || m < 1 || m > kGemvMaxRows || k % 8 != 0)
    throw std::invalid_argument("launch_gemv_bf16: unsupported jobs/m/k");
  kernels::GemvJobTable table{};
  table.num_jobs = num_jobs;
  table.first_warp[0] = 0;
  for (int j = 0; j < num_jobs; ++j) {
    table.w[j] = jobs[j].w;
    table.bias[j] = jobs[j].bias;
    table.y[j] = jobs[j].y;
    table.rows[j] = jobs[j].rows;
    table.first_warp[j + 1] =
        table.first_warp[j] + (jobs[j].rows + kernels::kGemvRowsPerWarp - 1) / kernels::kGemvRowsPerWarp;
  }
  switch (m) {
    case 1: gemv_for<1>(table, x, k, stream); break;
    case 2: gemv_for<2>(table, x, k, stream); break;
    case 3: gemv_for<3>(table, x, k, stream); break;
    case 4: gemv_for<4>(table, x, k, stream); break;
    case 5: gemv_for<5>(table, x, k, stream); break;
    case 6: gemv_for<6>(table, x, k, stream); break;
    case 7: gemv_for<7>(table, x, k, stream); break;
    case 8: gemv_for<8>(table, x, k, stream); break;
    case 9: gemv_for<9>(table, x, k, stream); break;
    case 10: gemv_for<10>(table, x, k, stream); break;
    case 11: gemv_for<11>(table, x, k, stream); break;
    case 12: gemv_for<12>(table, x, k, stream); break;
    case 13: gemv_for<13>(table, x, k, stream); break;
    case 14: gemv_for<14>(table, x, k, stream); break;
    case 15: gemv_for<15>(table, x, k, stream); break;
    default: gemv_for<16>(table, x, k, stream); break;
  }
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
                     cudaStream_t stream) {
  if (rows <= 0) return;
  kernels::rms_norm<<<static_cast<unsigned int>(rows), row_threads(cols), 0, stream>>>(x, cols, weight, eps, y);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm(float* h, const float* branch, int64_t rows, int64_t cols, const float* weight, float eps,
                         float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  kernels::add_rms_norm<<<static_cast<unsigned int>(rows), row_threads(cols), 0, stream>>>(h, branch, cols, weight,
                                                                                          eps, y);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                 const int32_t* positions, const float* inv_freq, float attention_factor, cudaStream_t stream) {
  if (tokens <= 0 || rotary_dim <= 0) return;
  kernels::rope<<<static_cast<unsigned int>(tokens), row_threads(heads * rotary_dim / 2), 0, stream>>>(
      x, heads, head_dim, rotary_dim / 2, positions, inv_freq, attention_factor);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  kernels::swiglu<<<stride_blocks(n), kThreads, 0, stream>>>(gate, up, n, out);
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
