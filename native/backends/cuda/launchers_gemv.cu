// Launchers of the GEMV kernels and of the read-bandwidth probe (see launchers.h).
#include <algorithm>
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

// The stream-K kernel on a grid of as many blocks as fit on the chip at once (kMaxBlocksPerSm
// caps them per SM when > 0), never more warps than units of work or than the workspace has.
template <typename Shape, int kMaxBlocksPerSm = 0>
void gemv_stream_k(GemvLaunch& l) {
  l.table.first_tile[0] = 0;
  for (int j = 0; j < l.num_jobs; ++j)
    l.table.first_tile[j + 1] = l.table.first_tile[j] + (l.jobs[j].rows + Shape::kBlockRows - 1) / Shape::kBlockRows;
  const int64_t units = int64_t(l.table.first_tile[l.num_jobs]) * ((l.k + 31) / 32);
  const GemvWorkspace& ws = l.options->workspace;
  if (!ws.partials || !ws.counters) throw std::invalid_argument("launch_gemv_bf16: the stream-K GEMV needs a workspace");
  auto run = [&](auto kernel) {
    static const int per_sm = [&] {
      if (Shape::kRingBytes > 48 * 1024)
        NINFER_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kRingBytes));
      int blocks = 0;
      NINFER_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Shape::kThreads, Shape::kRingBytes));
      return kMaxBlocksPerSm > 0 ? std::min(blocks, kMaxBlocksPerSm) : blocks;
    }();
    const int64_t blocks = std::clamp<int64_t>(
        std::min<int64_t>({int64_t(per_sm) * sm_count(), units / Shape::kWarps, ws.max_warps / Shape::kWarps}), 1,
        int64_t(1) << 30);
    if (blocks * Shape::kWarps > ws.max_warps) throw std::invalid_argument("launch_gemv_bf16: workspace too small");
    kernels::GemvWorkspace kws{ws.partials, ws.counters, ws.max_warps};
    launch_maybe_overlapped(l.options->overlap_previous, static_cast<unsigned int>(blocks), Shape::kThreads,
                            Shape::kRingBytes, l.stream, kernel, l.table, l.x, l.m, l.k, kws);
  };
  if constexpr (Shape::kPipelined) {
    if (l.m > 8)
      run(kernels::gemv_bf16_stream_k_pipelined<Shape, true>);
    else
      run(kernels::gemv_bf16_stream_k_pipelined<Shape, false>);
  } else {
    if (l.m > 8)
      run(kernels::gemv_bf16_stream_k<Shape, true>);
    else
      run(kernels::gemv_bf16_stream_k<Shape, false>);
  }
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
    {"stream-K pipelined r16 w8 s8", gemv_stream_k<GemvShape<2, 8, 8, true>>},
    {"stream-K pipelined r16 w4 s8", gemv_stream_k<GemvShape<2, 4, 8, true>>},
    {"stream-K pipelined r16 w8 s4", gemv_stream_k<GemvShape<2, 8, 4, true>>},
    {"stream-K pipelined r8 w8 s16", gemv_stream_k<GemvShape<1, 8, 16, true>>},
    {"stream-K pipelined r16 w8 s12", gemv_stream_k<GemvShape<2, 8, 12, true>>},
    {"stream-K pipelined r16 w8 s8 2/SM", gemv_stream_k<GemvShape<2, 8, 8, true>, 2>},
    {"stream-K registers r16 w8 u4", gemv_stream_k<GemvShape<2, 8, 4>>},
    {"stream-K registers r16 w8 u8", gemv_stream_k<GemvShape<2, 8, 8>>},
    {"stream-K registers r8 w8 u8", gemv_stream_k<GemvShape<1, 8, 8>>},
    {"block r16 w8 u4 (round 1)", gemv_block_split<GemvShape<2, 8, 4>>},
    {"block r16 w4 u4", gemv_block_split<GemvShape<2, 4, 4>>},
    {"legacy fma 4 rows/warp", gemv_legacy<>},
};
constexpr int kGemvVariantCount = static_cast<int>(sizeof(kGemvVariants) / sizeof(kGemvVariants[0]));
constexpr int kDefaultGemvVariant = 0;

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
  kGemvVariants[options.variant < 0 ? kDefaultGemvVariant : options.variant].launch(l);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_read_stream(const void* data, int64_t bytes, uint32_t* sink, int num_sms, cudaStream_t stream) {
  if (bytes < 16) return;
  kernels::read_stream<<<static_cast<unsigned int>(num_sms * 4), 512, 0, stream>>>(static_cast<const uint4*>(data),
                                                                                 bytes / 16, sink);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
