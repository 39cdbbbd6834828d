// Launchers of the GEMV kernels and of the read-bandwidth probe (see launchers.h).
#include <algorithm>
#include <stdexcept>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_bandwidth.cuh"
#include "backends/cuda/kernels_gemv.cuh"
#include "backends/cuda/launch_overlapped.h"
#include "backends/cuda/launchers.h"

namespace ninfer::cuda {

namespace {

using kernels::GemvShape;

// Resident blocks per SM at most (sizes the workspace for any grid).
constexpr int64_t kMaxBlocksPerSm = 32;

struct GemvLaunch {
  kernels::GemvJobTable table;
  const GemvJob* jobs;
  int num_jobs;
  const float* x;
  int m, k;
  const GemvOptions* options;
  cudaStream_t stream;
};

int sm_count() {
  int device = 0, sms = 0;
  NINFER_CUDA_CHECK(cudaGetDevice(&device));
  NINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

template <typename Shape>
void set_first_tiles(GemvLaunch& l) {
  l.table.first_tile[0] = 0;
  for (int j = 0; j < l.num_jobs; ++j)
    l.table.first_tile[j + 1] = l.table.first_tile[j] + (l.jobs[j].rows + Shape::kTileRows - 1) / Shape::kTileRows;
}

// One block per tile.
template <typename Shape>
void gemv_block_split(GemvLaunch& l) {
  set_first_tiles<Shape>(l);
  const dim3 grid(static_cast<unsigned int>(l.table.first_tile[l.num_jobs])), block(Shape::kThreads);
  if (l.m > 8)
    launch_overlapped(l.options->overlap_previous, grid, block, 0, l.stream,
                      kernels::gemv_bf16_block_split<Shape, true>, l.table, l.x, l.m, l.k);
  else
    launch_overlapped(l.options->overlap_previous, grid, block, 0, l.stream,
                      kernels::gemv_bf16_block_split<Shape, false>, l.table, l.x, l.m, l.k);
}

template <typename Shape, bool kWide>
int stream_k_blocks_per_sm() {
  static const int per_sm = [] {
    int blocks = 0;
    NINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, kernels::gemv_bf16_stream_k_blocks<Shape, kWide>, Shape::kThreads, 0));
    return static_cast<int>(std::min<int64_t>(blocks, kMaxBlocksPerSm));
  }();
  return per_sm;
}

// As many blocks as the chip holds at once, never more than units of work.
template <typename Shape, bool kWide>
void launch_stream_k(GemvLaunch& l, int64_t units) {
  const GemvWorkspace& ws = l.options->workspace;
  if (!ws.partials || !ws.counters)
    throw std::invalid_argument("launch_gemv_bf16: the stream-K GEMV needs a workspace");
  const int64_t blocks = std::max<int64_t>(
      1, std::min({int64_t(stream_k_blocks_per_sm<Shape, kWide>()) * sm_count(), units, ws.max_blocks}));
  launch_overlapped(l.options->overlap_previous, dim3(static_cast<unsigned int>(blocks)), dim3(Shape::kThreads), 0,
                    l.stream, kernels::gemv_bf16_stream_k_blocks<Shape, kWide>, l.table, l.x, l.m, l.k,
                    kernels::GemvWorkspace{ws.partials, ws.counters, ws.max_blocks});
}

template <typename Shape>
void gemv_stream_k(GemvLaunch& l) {
  set_first_tiles<Shape>(l);
  constexpr int kBatch = Shape::kWarps * Shape::kUnroll;
  const int64_t steps = ((l.k + 31) / 32 + kBatch - 1) / kBatch;  // units per tile
  const int64_t units = int64_t(l.table.first_tile[l.num_jobs]) * steps;
  if (l.m > 8)
    launch_stream_k<Shape, true>(l, units);
  else
    launch_stream_k<Shape, false>(l, units);
}

struct GemvVariant {
  const char* name;
  void (*launch)(GemvLaunch&);
};
// Rows per tile, warps per block, chunks of 32 k in flight per warp (bench/bench_cuda_gemv.py).
constexpr GemvVariant kGemvVariants[] = {
    {"block split r16 w4 u4", gemv_block_split<GemvShape<2, 4, 4>>},
    {"stream-K r16 w8 u4", gemv_stream_k<GemvShape<2, 8, 4>>},
    {"stream-K r16 w4 u4", gemv_stream_k<GemvShape<2, 4, 4>>},
};
constexpr int kGemvVariantCount = static_cast<int>(sizeof(kGemvVariants) / sizeof(kGemvVariants[0]));

// The launcher's choice, from the H200 timings of the 27B decode shapes (2026-11-29): the block
// split is fastest at m <= 8 for k <= 8192 (q/k/v, GDN in_proj, gate/up at 99-100 µs, o_proj),
// stream-K for the long rows of down_proj (k = 17408: only 320 tiles of 16 rows) and for
// m > 8 (CudaBackend passes NINFER_GEMV_VARIANT=i as GemvOptions::variant, to time the model
// with variant i).
int default_gemv_variant(int m, int k) {
  if (m > 8) return 2;
  return k > 8192 ? 1 : 0;
}

}  // namespace

int64_t gemv_workspace_blocks(int num_sms) { return kMaxBlocksPerSm * num_sms; }

size_t gemv_workspace_bytes(int64_t max_blocks) {
  return static_cast<size_t>(max_blocks) * (2 * kernels::kGemvMaxSlotFloats * sizeof(float) + sizeof(int32_t));
}

GemvWorkspace gemv_workspace_at(void* memory, int64_t max_blocks) {
  auto* partials = static_cast<float*>(memory);
  return {partials, reinterpret_cast<int32_t*>(partials + max_blocks * 2 * kernels::kGemvMaxSlotFloats), max_blocks};
}

int gemv_variant_count() { return kGemvVariantCount; }

const char* gemv_variant_name(int variant) {
  if (variant < 0 || variant >= kGemvVariantCount) throw std::out_of_range("gemv_variant_name: no such variant");
  return kGemvVariants[variant].name;
}

void launch_gemv_bf16(const GemvJob* jobs, int num_jobs, const float* x, int m, int k, const GemvOptions& options,
                      cudaStream_t stream) {
  if (num_jobs < 1 || num_jobs > kGemvMaxJobs || m < 1 || m > kGemvMaxRows || k % 8 != 0)
    throw std::invalid_argument("launch_gemv_bf16: unsupported jobs/m/k");
  if (options.variant >= kGemvVariantCount) throw std::invalid_argument("launch_gemv_bf16: no such variant");
  GemvLaunch l{{}, jobs, num_jobs, x, m, k, &options, stream};
  l.table.num_jobs = num_jobs;
  l.table.accumulate = options.accumulate ? 1 : 0;
  for (int j = 0; j < num_jobs; ++j) {
    if (jobs[j].rows < 1) throw std::invalid_argument("launch_gemv_bf16: a weight without rows");
    l.table.w[j] = jobs[j].w;
    l.table.bias[j] = jobs[j].bias;
    l.table.y[j] = jobs[j].y;
    l.table.rows[j] = jobs[j].rows;
  }
  kGemvVariants[options.variant < 0 ? default_gemv_variant(m, k) : options.variant].launch(l);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_read_stream(const void* data, int64_t bytes, uint32_t* sink, int num_sms, cudaStream_t stream) {
  if (bytes < 16) return;
  kernels::read_stream<<<static_cast<unsigned int>(num_sms * 4), 512, 0, stream>>>(static_cast<const uint4*>(data),
                                                                                 bytes / 16, sink);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
