// Launchers of the GEMV kernels and of the read-bandwidth probe (see launchers.h).
#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_bandwidth.cuh"
#include "backends/cuda/kernels_gemv.cuh"
#include "backends/cuda/kernels_gemv_baselines.cuh"
#include "backends/cuda/launchers.h"

namespace ninfer::cuda {

namespace {

using kernels::GemvShape;
using kernels::WeightLoad;

// Resident warps per SM at most (sizes the workspace for any kernel shape).
constexpr int64_t kMaxWarpsPerSm = 64;

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

template <typename Kernel, typename... Args>
void launch_maybe_overlapped(bool overlap, unsigned int blocks, unsigned int threads, size_t smem, cudaStream_t stream,
                             Kernel kernel, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (overlap) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  NINFER_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

enum class StreamK { WarpRegisters, WarpPipelined, Blocks };

template <typename Shape, StreamK kKind, bool kWide>
constexpr auto stream_k_kernel() {
  if constexpr (kKind == StreamK::WarpRegisters) return kernels::gemv_bf16_stream_k<Shape, kWide>;
  else if constexpr (kKind == StreamK::WarpPipelined) return kernels::gemv_bf16_stream_k_pipelined<Shape, kWide>;
  else return kernels::gemv_bf16_stream_k_blocks<Shape, kWide>;
}

// Blocks of one stream-K kernel resident per SM (kMaxBlocksPerSm caps it when > 0).
template <typename Shape, StreamK kKind, bool kWide, int kMaxBlocksPerSm>
int stream_k_blocks_per_sm() {
  static const int per_sm = [] {
    const auto kernel = stream_k_kernel<Shape, kKind, kWide>();
    if (Shape::kRingBytes > 48 * 1024)
      NINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kRingBytes));
    int blocks = 0;
    NINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Shape::kThreads, Shape::kRingBytes));
    return kMaxBlocksPerSm > 0 ? std::min(blocks, kMaxBlocksPerSm) : blocks;
  }();
  return per_sm;
}

// A stream-K kernel on a grid of as many blocks as fit on the chip at once, never more workers
// (warps, or blocks for StreamK::Blocks) than units of work or workspace slots.
template <typename Shape, StreamK kKind, bool kWide, int kMaxBlocksPerSm>
void launch_stream_k(GemvLaunch& l, int64_t units) {
  const GemvWorkspace& ws = l.options->workspace;
  if (!ws.partials || !ws.counters) throw std::invalid_argument("launch_gemv_bf16: the stream-K GEMV needs a workspace");
  const int64_t per_block = kKind == StreamK::Blocks ? 1 : Shape::kWarps;  // workers per block
  const int64_t capacity = int64_t(stream_k_blocks_per_sm<Shape, kKind, kWide, kMaxBlocksPerSm>()) * sm_count();
  const int64_t blocks =
      std::max<int64_t>(1, std::min({capacity, (units + per_block - 1) / per_block, ws.max_warps / per_block}));
  const kernels::GemvWorkspace kws{ws.partials, ws.counters, ws.max_warps};
  launch_maybe_overlapped(l.options->overlap_previous, static_cast<unsigned int>(blocks), Shape::kThreads,
                          Shape::kRingBytes, l.stream, stream_k_kernel<Shape, kKind, kWide>(), l.table, l.x, l.m, l.k,
                          kws);
}

template <typename Shape, StreamK kKind, int kMaxBlocksPerSm = 0>
void gemv_stream_k(GemvLaunch& l) {
  l.table.first_tile[0] = 0;
  for (int j = 0; j < l.num_jobs; ++j)
    l.table.first_tile[j + 1] = l.table.first_tile[j] + (l.jobs[j].rows + Shape::kBlockRows - 1) / Shape::kBlockRows;
  const int chunks = (l.k + 31) / 32;
  const int units_per_tile =
      kKind == StreamK::Blocks ? (chunks + Shape::kWarps * Shape::kUnroll - 1) / (Shape::kWarps * Shape::kUnroll)
                               : chunks;
  const int64_t units = int64_t(l.table.first_tile[l.num_jobs]) * units_per_tile;
  if (l.m > 8)
    launch_stream_k<Shape, kKind, true, kMaxBlocksPerSm>(l, units);
  else
    launch_stream_k<Shape, kKind, false, kMaxBlocksPerSm>(l, units);
}

// Baseline: one block per 8·kRowTiles rows.
template <typename Shape>
void gemv_block_split(GemvLaunch& l) {
  l.table.first_block[0] = 0;
  for (int j = 0; j < l.num_jobs; ++j)
    l.table.first_block[j + 1] =
        l.table.first_block[j] + (l.jobs[j].rows + Shape::kBlockRows - 1) / Shape::kBlockRows;
  const auto blocks = static_cast<unsigned int>(l.table.first_block[l.num_jobs]);
  if (l.m > 8)
    launch_maybe_overlapped(l.options->overlap_previous, blocks, Shape::kThreads, 0, l.stream,
                            kernels::gemv_bf16_block_split<Shape, true>, l.table, l.x, l.m, l.k);
  else
    launch_maybe_overlapped(l.options->overlap_previous, blocks, Shape::kThreads, 0, l.stream,
                            kernels::gemv_bf16_block_split<Shape, false>, l.table, l.x, l.m, l.k);
}

// Baseline: the CUDA-core kernel, 4 rows a warp, x·W on FMAs (no accumulate, no overlap).
template <int M = 1>
void gemv_legacy(GemvLaunch& l) {
  if constexpr (M < kGemvMaxRows) {
    if (l.m > M) return gemv_legacy<M + 1>(l);
  }
  if (l.options->accumulate) throw std::invalid_argument("launch_gemv_bf16: the legacy kernel does not accumulate");
  kernels::GemvLegacyTable table{};
  table.num_jobs = l.num_jobs;
  for (int j = 0; j < l.num_jobs; ++j) {
    table.w[j] = l.jobs[j].w;
    table.bias[j] = l.jobs[j].bias;
    table.y[j] = l.jobs[j].y;
    table.rows[j] = l.jobs[j].rows;
    table.first_warp[j + 1] =
        table.first_warp[j] + (l.jobs[j].rows + kernels::kGemvRowsPerWarp - 1) / kernels::kGemvRowsPerWarp;
  }
  const int blocks = (table.first_warp[l.num_jobs] + kernels::kGemvWarpsPerBlock - 1) / kernels::kGemvWarpsPerBlock;
  kernels::gemv_bf16_legacy<M><<<blocks, kernels::kGemvWarpsPerBlock * 32, 0, l.stream>>>(table, l.x, l.k);
}

struct GemvVariant {
  const char* name;
  void (*launch)(GemvLaunch&);
};
// The benchmark's variants: stream-K (rows per tile, warps per block, chunks in flight per warp,
// blocks per SM cap) and the baselines.
constexpr GemvVariant kGemvVariants[] = {
    {"block stream-K r16 w4 u4", gemv_stream_k<GemvShape<2, 4, 4>, StreamK::Blocks>},
    {"block stream-K r16 w8 u4", gemv_stream_k<GemvShape<2, 8, 4>, StreamK::Blocks>},
    {"block stream-K r16 w4 u8", gemv_stream_k<GemvShape<2, 4, 8>, StreamK::Blocks>},
    {"block stream-K r16 w8 u2", gemv_stream_k<GemvShape<2, 8, 2>, StreamK::Blocks>},
    {"block stream-K r8 w8 u4", gemv_stream_k<GemvShape<1, 8, 4>, StreamK::Blocks>},
    {"block stream-K r16 w4 u4 8/SM", gemv_stream_k<GemvShape<2, 4, 4, false, WeightLoad::StreamPrefetch, 8>,
                                                    StreamK::Blocks>},
    {"block stream-K r16 w8 u4 4/SM", gemv_stream_k<GemvShape<2, 8, 4, false, WeightLoad::StreamPrefetch, 4>,
                                                    StreamK::Blocks>},
    {"warp stream-K pipelined r16 w8 s8 L2::256B", gemv_stream_k<GemvShape<2, 8, 8, true>, StreamK::WarpPipelined>},
    {"warp stream-K registers r16 w8 u4", gemv_stream_k<GemvShape<2, 8, 4>, StreamK::WarpRegisters>},
    {"block r16 w4 u4 (round 2 best)", gemv_block_split<GemvShape<2, 4, 4>>},
    {"block r16 w8 u4 (round 1)", gemv_block_split<GemvShape<2, 8, 4>>},
    {"legacy fma 4 rows/warp", gemv_legacy<>},
};
constexpr int kGemvVariantCount = static_cast<int>(sizeof(kGemvVariants) / sizeof(kGemvVariants[0]));
// NINFER_GEMV_VARIANT=i (read once) makes variant i the default, to time the model with it.
int default_gemv_variant() {
  static const int variant = [] {
    const char* v = std::getenv("NINFER_GEMV_VARIANT");
    const int i = v ? std::atoi(v) : -1;
    return i >= 0 && i < kGemvVariantCount ? i : 9;
  }();
  return variant;
}

}  // namespace

int64_t gemv_workspace_warps(int num_sms) { return kMaxWarpsPerSm * num_sms; }

size_t gemv_workspace_bytes(int64_t max_warps) {
  return static_cast<size_t>(max_warps) * (2 * kernels::kGemvMaxSlotFloats * sizeof(float) + sizeof(int32_t));
}

GemvWorkspace gemv_workspace_at(void* memory, int64_t max_warps) {
  auto* partials = static_cast<float*>(memory);
  return {partials, reinterpret_cast<int32_t*>(partials + max_warps * 2 * kernels::kGemvMaxSlotFloats), max_warps};
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
  kGemvVariants[options.variant < 0 ? default_gemv_variant() : options.variant].launch(l);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_read_stream(const void* data, int64_t bytes, uint32_t* sink, int num_sms, cudaStream_t stream) {
  if (bytes < 16) return;
  kernels::read_stream<<<static_cast<unsigned int>(num_sms * 4), 512, 0, stream>>>(static_cast<const uint4*>(data),
                                                                                 bytes / 16, sink);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
