// Launchers of the elementwise and GEMV kernels (see launchers.h).
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_bandwidth.cuh"
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

// Launches Kernel<kPerThread> (one block per row) with the smallest kPerThread that holds a
// row in registers, or the looping Kernel<0> for rows wider than 16 values a thread.
template <template <int> class Launch, typename... Args>
void per_row(int64_t rows, int64_t cols, cudaStream_t stream, Args... args) {
  const int threads = row_threads(cols);
  const int64_t per_thread = (cols + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned int>(rows)), block(static_cast<unsigned int>(threads));
  if (per_thread <= 1) return Launch<1>::run(grid, block, stream, args...);
  if (per_thread <= 2) return Launch<2>::run(grid, block, stream, args...);
  if (per_thread <= 4) return Launch<4>::run(grid, block, stream, args...);
  if (per_thread <= 8) return Launch<8>::run(grid, block, stream, args...);
  if (per_thread <= 16) return Launch<16>::run(grid, block, stream, args...);
  Launch<0>::run(grid, block, stream, args...);
}

template <int kPerThread>
struct RmsNormLaunch {
  static void run(dim3 grid, dim3 block, cudaStream_t stream, const float* x, int64_t cols, const float* weight,
                  float eps, float* y) {
    kernels::rms_norm<kPerThread><<<grid, block, 0, stream>>>(x, cols, weight, eps, y);
  }
};

template <int kPerThread>
struct AddRmsNormLaunch {
  static void run(dim3 grid, dim3 block, cudaStream_t stream, float* h, const float* branch, int64_t cols,
                  const float* weight, float eps, float* y) {
    kernels::add_rms_norm<kPerThread><<<grid, block, 0, stream>>>(h, branch, cols, weight, eps, y);
  }
};

template <typename Shape>
void gemv_mma(kernels::GemvJobTable table, const GemvJob* jobs, int num_jobs, const float* x, int m, int k,
              cudaStream_t stream) {
  table.first_block[0] = 0;
  for (int j = 0; j < num_jobs; ++j)
    table.first_block[j + 1] = table.first_block[j] + (jobs[j].rows + Shape::kBlockRows - 1) / Shape::kBlockRows;
  const unsigned int blocks = static_cast<unsigned int>(table.first_block[num_jobs]);
  if (m > 8)
    kernels::gemv_bf16_mma<Shape, true><<<blocks, Shape::kThreads, 0, stream>>>(table, x, m, k);
  else
    kernels::gemv_bf16_mma<Shape, false><<<blocks, Shape::kThreads, 0, stream>>>(table, x, m, k);
}

template <int M>
void gemv_legacy_for(const kernels::GemvLegacyTable& table, const float* x, int k, cudaStream_t stream) {
  const int warps = table.first_warp[table.num_jobs];
  const int blocks = (warps + kernels::kGemvWarpsPerBlock - 1) / kernels::kGemvWarpsPerBlock;
  kernels::gemv_bf16_legacy<M><<<blocks, kernels::kGemvWarpsPerBlock * 32, 0, stream>>>(table, x, k);
}

template <int M = 1>
void gemv_legacy(const GemvJob* jobs, int num_jobs, const float* x, int m, int k, cudaStream_t stream) {
  if constexpr (M < kGemvMaxRows) {
    if (m > M) return gemv_legacy<M + 1>(jobs, num_jobs, x, m, k, stream);
  }
  kernels::GemvLegacyTable table{};
  table.num_jobs = num_jobs;
  for (int j = 0; j < num_jobs; ++j) {
    table.w[j] = jobs[j].w;
    table.bias[j] = jobs[j].bias;
    table.y[j] = jobs[j].y;
    table.rows[j] = jobs[j].rows;
    table.first_warp[j + 1] =
        table.first_warp[j] + (jobs[j].rows + kernels::kGemvRowsPerWarp - 1) / kernels::kGemvRowsPerWarp;
  }
  gemv_legacy_for<M>(table, x, k, stream);
}

using kernels::GemvShape;
using kernels::WeightLoad;
using GemvLauncher = void (*)(kernels::GemvJobTable, const GemvJob*, int, const float*, int, int, cudaStream_t);
struct GemvVariant {
  const char* name;
  GemvLauncher launch;  // null: the legacy kernel
};
// Benchmark variants of the GEMV: rows per block (8 per tile), warps splitting k, chunks in flight.
constexpr GemvVariant kGemvVariants[] = {
    {"legacy fma 4 rows/warp", nullptr},
    {"mma r16 w8 u4", gemv_mma<GemvShape<2, 8, 4>>},
    {"mma r8 w8 u8", gemv_mma<GemvShape<1, 8, 8>>},
    {"mma r8 w8 u4", gemv_mma<GemvShape<1, 8, 4>>},
    {"mma r16 w4 u4", gemv_mma<GemvShape<2, 4, 4>>},
    {"mma r32 w8 u2", gemv_mma<GemvShape<4, 8, 2>>},
    {"mma r16 w16 u2", gemv_mma<GemvShape<2, 16, 2>>},
    {"mma r8 w4 u8", gemv_mma<GemvShape<1, 4, 8>>},
    {"mma r16 w8 u4 no-L2-prefetch", gemv_mma<GemvShape<2, 8, 4, WeightLoad::Stream>>},
    {"mma r16 w8 u4 ldg", gemv_mma<GemvShape<2, 8, 4, WeightLoad::ReadOnly>>},
    {"mma r32 w4 u4", gemv_mma<GemvShape<4, 4, 4>>},
    {"mma r8 w16 u4", gemv_mma<GemvShape<1, 16, 4>>},
};
constexpr int kGemvVariantCount = static_cast<int>(sizeof(kGemvVariants) / sizeof(kGemvVariants[0]));

// The launcher's own choice (bench/bench_cuda_gemv.py measured the variants).
int default_gemv_variant(int /*m*/, int64_t /*total_rows*/, int /*k*/) { return 1; }

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

int gemv_variant_count() { return kGemvVariantCount; }

const char* gemv_variant_name(int variant) {
  if (variant < 0 || variant >= kGemvVariantCount) throw std::out_of_range("gemv_variant_name: no such variant");
  return kGemvVariants[variant].name;
}

void launch_gemv_bf16(const GemvJob* jobs, int num_jobs, const float* x, int m, int k, bool accumulate,
                      cudaStream_t stream, int variant) {
  if (num_jobs < 1 || num_jobs > kGemvMaxJobs || m < 1 || m > kGemvMaxRows || k % 8 != 0)
    throw std::invalid_argument("launch_gemv_bf16: unsupported jobs/m/k");
  if (variant >= kGemvVariantCount) throw std::invalid_argument("launch_gemv_bf16: no such variant");
  int64_t total_rows = 0;
  for (int j = 0; j < num_jobs; ++j) total_rows += jobs[j].rows;
  if (variant < 0) variant = default_gemv_variant(m, total_rows, k);
  const GemvVariant& v = kGemvVariants[variant];
  if (!v.launch) {
    if (accumulate) throw std::invalid_argument("launch_gemv_bf16: the legacy kernel does not accumulate");
    gemv_legacy(jobs, num_jobs, x, m, k, stream);
  } else {
    kernels::GemvJobTable table{};
    table.num_jobs = num_jobs;
    table.accumulate = accumulate ? 1 : 0;
    for (int j = 0; j < num_jobs; ++j) {
      table.w[j] = jobs[j].w;
      table.bias[j] = jobs[j].bias;
      table.y[j] = jobs[j].y;
      table.rows[j] = jobs[j].rows;
    }
    v.launch(table, jobs, num_jobs, x, m, k, stream);
  }
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_read_stream(const void* data, int64_t bytes, uint32_t* sink, int num_sms, cudaStream_t stream) {
  if (bytes < 16) return;
  kernels::read_stream<<<static_cast<unsigned int>(num_sms * 4), 512, 0, stream>>>(static_cast<const uint4*>(data),
                                                                                 bytes / 16, sink);
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
  per_row<RmsNormLaunch>(rows, cols, stream, x, cols, weight, eps, y);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm(float* h, const float* branch, int64_t rows, int64_t cols, const float* weight, float eps,
                         float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  per_row<AddRmsNormLaunch>(rows, cols, stream, h, branch, cols, weight, eps, y);
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
