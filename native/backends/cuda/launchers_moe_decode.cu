// Launchers of the fused decode MoE kernels (see launchers_moe_decode.h).
#include <algorithm>
#include <stdexcept>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_moe_decode.cuh"
#include "backends/cuda/launch_overlapped.h"
#include "backends/cuda/launchers_moe_decode.h"

namespace ninfer::cuda {

namespace {

using kernels::kMoeDecodeWarps;
using kernels::kMoeGateUpRowsPerBlock;

// Dynamic shared memory the kernels may ask for (opted into once per kernel).
constexpr size_t kMaxSmem = 160 * 1024;
constexpr int kThreads = kMoeDecodeWarps * 32;

bool weight_ok(const MoeWeightRef& w, int32_t k) {
  if (!w.codes || w.k != k || k <= 0 || w.format < 0 || w.format > 2) return false;
  if (k % kernels::moe_chunk_cols(w.format) != 0) return false;
  if (w.format == kernels::kMoeFmtFp8 && (!w.scales || w.group_rows < 1)) return false;
  if (w.format == kernels::kMoeFmtNvfp4 && (!w.scales || !w.scale2)) return false;
  return true;
}

int route_blocks(const MoeDecodeJob& job) {
  const int rows = job.num_experts + (job.shared_gate_row.codes ? 1 : 0);
  return (rows + kMoeDecodeWarps - 1) / kMoeDecodeWarps;
}

// Staged rows are padded to 32 floats (kernels::moe_xs_stride, the swizzle's unit).
using kernels::moe_xs_stride;
size_t route_smem(const MoeDecodeJob& job) { return size_t(moe_xs_stride(job.hidden)) * 4; }
size_t gate_up_smem(const MoeDecodeJob& job) { return size_t(moe_xs_stride(job.hidden)) * 4; }
size_t down_smem(const MoeDecodeJob& job) {
  return (size_t(job.top_k) * moe_xs_stride(job.ff) + (job.shared_ff > 0 ? moe_xs_stride(job.shared_ff) : 0)) * 4;
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) NINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                static_cast<int>(kMaxSmem)));
}

template <int PER_LANE>
void launch_route(const MoeDecodeJob& job, bool overlap, cudaStream_t stream) {
  static const bool configured = [] {
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(kernels::moe_decode_route<PER_LANE>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxSmem)));
    return true;
  }();
  (void)configured;
  launch_overlapped(overlap, dim3(static_cast<unsigned int>(route_blocks(job)), static_cast<unsigned int>(job.tokens)),
                    dim3(kThreads), route_smem(job), stream, kernels::moe_decode_route<PER_LANE>, job);
}

}  // namespace

bool moe_decode_supported(const MoeDecodeJob& job) {
  if (job.tokens <= 0 || job.tokens > kMoeDecodeMaxTokens || job.hidden <= 0 || job.ff <= 0 || job.shared_ff < 0)
    return false;
  if (job.num_experts < 1 || job.num_experts > 512 || job.top_k < 1 || job.top_k > 32 || job.top_k > job.num_experts)
    return false;
  if (!weight_ok(job.gate_up, job.hidden) || !weight_ok(job.down, job.ff)) return false;
  if (job.router.codes && !weight_ok(job.router, job.hidden)) return false;
  if (job.shared_gate_row.codes && !weight_ok(job.shared_gate_row, job.hidden)) return false;
  if (job.shared_ff > 0 && !(weight_ok(job.shared_gate, job.hidden) && weight_ok(job.shared_up, job.hidden) &&
                             weight_ok(job.shared_down, job.shared_ff)))
    return false;
  if (int64_t(job.tokens) * job.top_k + job.tokens > 65535) return false;  // grid.y of gate_up (route: tokens)
  return route_smem(job) <= kMaxSmem && gate_up_smem(job) <= kMaxSmem && down_smem(job) <= kMaxSmem;
}

size_t moe_decode_act_floats(const MoeDecodeJob& job) {
  return size_t(job.tokens) * job.top_k * job.ff + size_t(job.tokens) * job.shared_ff;
}

void launch_moe_decode_route(const MoeDecodeJob& job, bool overlap, cudaStream_t stream) {
  if (!job.router.codes || !job.expert_ids || !job.route_weights || !job.route_logits || !job.route_arrivals)
    throw std::invalid_argument(
        "moe_decode_route: needs the router weight, the id/weight outputs, the logit scratch and the arrival "
        "counters");
  const int per_lane = (job.num_experts + 31) / 32;
  if (per_lane <= 1) launch_route<1>(job, overlap, stream);
  else if (per_lane <= 2) launch_route<2>(job, overlap, stream);
  else if (per_lane <= 4) launch_route<4>(job, overlap, stream);
  else if (per_lane <= 8) launch_route<8>(job, overlap, stream);
  else launch_route<16>(job, overlap, stream);
}

void launch_moe_decode_gate_up(const MoeDecodeJob& job, bool overlap, cudaStream_t stream) {
  static const bool configured = [] {
    allow_smem(kernels::moe_decode_gate_up, kMaxSmem);
    return true;
  }();
  (void)configured;
  const int rows = std::max(job.ff, job.shared_ff);
  const dim3 grid((rows + kMoeGateUpRowsPerBlock - 1) / kMoeGateUpRowsPerBlock,
                  job.tokens * job.top_k + (job.shared_ff > 0 ? job.tokens : 0));
  launch_overlapped(overlap, grid, dim3(kThreads), gate_up_smem(job), stream, kernels::moe_decode_gate_up, job);
}

void launch_moe_decode_down(const MoeDecodeJob& job, bool overlap, cudaStream_t stream) {
  static const bool configured = [] {
    allow_smem(kernels::moe_decode_down, kMaxSmem);
    return true;
  }();
  (void)configured;
  const dim3 grid((job.hidden + kMoeDecodeWarps - 1) / kMoeDecodeWarps, job.tokens);
  launch_overlapped(overlap, grid, dim3(kThreads), down_smem(job), stream, kernels::moe_decode_down, job);
}

}  // namespace ninfer::cuda
