// The sparse MoE experts of the CUDA backend (Backend::moe_experts): routing on the device, then
// one of three ways to run the routed experts:
// - Gemv (decode batches up to kMoeGemvPairs (token, slot) pairs): each pair's expert as a GEMV
//   that reads its expert id on the device; weights are read once per pair.
// - Grouped (everything else): the plan is built on the device and two grouped tensor-core GEMM
//   launches cover all experts (launchers_moe.h); weights are read once per used expert tile.
// - Host: the ids come to the host (one synchronisation per layer) to group the pairs and run
//   each used expert's matmuls with cuBLAS; kept for shapes the grouped kernels do not take
//   (hidden or ff not a multiple of 8) and as the baseline of bench/bench_cuda_moe.py.
// All three add the weighted expert rows of each token in slot order. FP8/NVFP4 stacks stay in
// their stored format: the Gemv path reads them quantized (launchers_moe_decode.h), the other
// two run on bf16 copies made on the device per call (cuda_backend_moe_fused.cpp).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers_hybrid.h"
#include "backends/cuda/launchers_moe.h"

namespace ninfer::cuda {

namespace {

// (token, slot) pairs up to which the per-pair GEMV runs. bench/bench_cuda_moe.py on the 35B-A3B
// shape (H200, 2026-11-29): GEMV 0.048 / 0.091 / 0.260 ms at 1 / 4 / 16 tokens against grouped
// 0.084 / 0.129 / 0.251 ms; at 32 tokens grouped wins (0.380 vs 0.487 ms).
constexpr int64_t kMoeGemvPairs = 128;

template <typename T>
T* scratch_of(DeviceScratch& s, int64_t elements, cudaStream_t stream) {
  return static_cast<T*>(s.get(static_cast<size_t>(std::max<int64_t>(elements, 1)) * sizeof(T), stream));
}

// Rows [first, first + count) of a bf16 weight, as a weight of its own.
Weight row_block(const Weight& w, int64_t first, int64_t count) {
  return Weight{w.dtype, count, w.cols, static_cast<const uint16_t*>(w.data) + first * w.cols};
}

bool gemv_supported(int64_t hidden, int64_t ff) {
  return hidden % 8 == 0 && ff % 8 == 0 && hidden <= 12288 && ff <= 12288;
}

}  // namespace

CudaBackend::MoePath CudaBackend::moe_path_for(int64_t pairs, int64_t hidden, const MoeExperts& experts) const {
  const bool grouped_ok = moe_grouped_supported(hidden, experts.ff, experts.num_experts);
  const bool gemv_ok = gemv_supported(hidden, experts.ff) && pairs <= 65535;
  switch (moe_path_) {
    case MoePath::Gemv:
      if (!gemv_ok) throw std::invalid_argument("moe_experts: the GEMV path does not take this shape");
      return MoePath::Gemv;
    case MoePath::Grouped:
      if (!grouped_ok) throw std::invalid_argument("moe_experts: the grouped path needs hidden and ff % 8 == 0");
      return MoePath::Grouped;
    case MoePath::Host: return MoePath::Host;
    case MoePath::Auto: break;
  }
  if (gemv_ok && pairs <= kMoeGemvPairs) return MoePath::Gemv;
  return grouped_ok ? MoePath::Grouped : MoePath::Host;
}

void CudaBackend::moe_experts(const float* x, int64_t tokens, int64_t hidden, const float* router_logits,
                              const MoeExperts& experts, float* out) {
  const int64_t e_count = experts.num_experts, top_k = experts.top_k;
  experts.check(hidden);
  if (experts.held_experts() != experts.num_experts)
    throw std::invalid_argument("CUDA moe_experts: a subset of the experts (expert parallelism) is not supported yet");
  auto stored_here = [](DType t) { return t == DType::BF16 || is_block_quantized(t); };
  if (!stored_here(experts.gate_up.dtype) || !stored_here(experts.down.dtype))
    throw std::invalid_argument("CUDA moe_experts: expert weights must be uploaded by this backend (bf16/fp8/nvfp4)");
  const bool quantized = is_block_quantized(experts.gate_up.dtype) || is_block_quantized(experts.down.dtype);
  fill_zero(out, tokens * hidden);
  if (tokens <= 0) return;
  const int64_t pairs = tokens * top_k;
  const MoePath path = moe_path_for(pairs, hidden, experts);
  if (path == MoePath::Host) not_graphable();  // reads the expert ids on the host
  note(static_cast<int64_t>(path));
  if (dry()) return;
  activate();
  auto* route = scratch_of<float>(moe_route_, 2 * pairs, stream_);
  auto* ids_dev = reinterpret_cast<int32_t*>(route);
  float* route_weights = route + pairs;
  launch_moe_route_softmax_topk(router_logits, tokens, e_count, top_k, experts.renormalize, ids_dev, route_weights,
                                stream_);
  // Decode reads quantized stacks in their stored format (cuda_backend_moe_fused.cpp).
  if (quantized && path == MoePath::Gemv &&
      moe_experts_quantized_gemv(x, tokens, hidden, ids_dev, route_weights, experts, out))
    return;
  if (quantized) {  // grouped and host paths: bf16 copies of the stacks, made on the device
    const MoeExperts widened = moe_experts_as_bf16(experts);
    moe_experts_routed(x, tokens, hidden, path, ids_dev, route_weights, widened, out);
    return;
  }
  moe_experts_routed(x, tokens, hidden, path, ids_dev, route_weights, experts, out);
}

// The routed experts of bf16 stacks on a path, the ids and weights on the device.
void CudaBackend::moe_experts_routed(const float* x, int64_t tokens, int64_t hidden, MoePath path,
                                     const int32_t* ids_dev, const float* route_weights, const MoeExperts& experts,
                                     float* out) {
  const int64_t e_count = experts.num_experts, ff = experts.ff, top_k = experts.top_k;
  const int64_t pairs = tokens * top_k;
  const auto* gate_up_w = static_cast<const uint16_t*>(experts.gate_up.data);
  const auto* down_w = static_cast<const uint16_t*>(experts.down.data);
  if (path == MoePath::Gemv) {
    float* gate_up = scratch_of<float>(moe_x_, pairs * 2 * ff, stream_);
    float* act = scratch_of<float>(moe_gate_, pairs * ff, stream_);
    float* y = scratch_of<float>(moe_y_, pairs * hidden, stream_);
    launch_moe_gemv(gate_up_w, 2 * ff, 2 * ff, hidden, ids_dev, pairs, top_k, x, false, gate_up, stream_);
    launch_swiglu_halves(gate_up, pairs, ff, act, stream_);
    launch_moe_gemv(down_w, hidden, hidden, ff, ids_dev, pairs, top_k, act, true, y, stream_);
    launch_moe_combine(y, hidden, nullptr, route_weights, tokens, top_k, out, stream_);
    return;
  }
  if (path == MoePath::Grouped) {
    MoeGroupedJob job;
    job.x = x;
    job.tokens = tokens;
    job.hidden = hidden;
    job.expert_ids = ids_dev;
    job.route_weights = route_weights;
    job.top_k = top_k;
    job.num_experts = e_count;
    job.ff = ff;
    job.gate_up = gate_up_w;
    job.down = down_w;
    job.out = out;
    job.tile_rows = moe_tile_rows_;
    job.tile_cols = moe_tile_cols_;
    void* scratch = moe_grouped_.get(moe_grouped_scratch_bytes(job), stream_);
    launch_moe_grouped_experts(job, scratch, stream_);
    return;
  }
  moe_experts_on_host_plan(x, tokens, hidden, ids_dev, route_weights, experts, out);
}

// The Host path: counting sort of the pairs by expert on the host, tokens ascending within an
// expert, then one cuBLAS matmul pair per used expert.
void CudaBackend::moe_experts_on_host_plan(const float* x, int64_t tokens, int64_t hidden, const int32_t* ids_dev,
                                           const float* route_weights, const MoeExperts& experts, float* out) {
  const int64_t e_count = experts.num_experts, ff = experts.ff, top_k = experts.top_k, pairs = tokens * top_k;
  std::vector<int32_t> ids(static_cast<size_t>(pairs));
  NINFER_CUDA_CHECK(cudaMemcpyAsync(ids.data(), ids_dev, ids.size() * 4, cudaMemcpyDeviceToHost, stream_));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<int64_t> offsets(static_cast<size_t>(e_count + 1), 0);
  for (const int32_t e : ids) {
    if (e < 0 || e >= e_count) throw std::runtime_error("moe_experts: the router produced an invalid expert id");
    ++offsets[static_cast<size_t>(e) + 1];
  }
  for (int64_t e = 0; e < e_count; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> plan(static_cast<size_t>(2 * pairs));  // [gather rows | row of each pair]
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t row = fill[static_cast<size_t>(ids[static_cast<size_t>(p)])]++;
    plan[static_cast<size_t>(row)] = static_cast<int32_t>(p / top_k);
    plan[static_cast<size_t>(pairs + p)] = static_cast<int32_t>(row);
  }
  const auto* plan_dev = stage(moe_plan_, std::span<const int32_t>(plan));
  float* xg = scratch_of<float>(moe_x_, pairs * hidden, stream_);
  float* gate = scratch_of<float>(moe_gate_, pairs * ff, stream_);
  float* up = scratch_of<float>(moe_up_, pairs * ff, stream_);
  float* y = scratch_of<float>(moe_y_, pairs * hidden, stream_);
  launch_gather_rows(x, hidden, plan_dev, pairs, xg, stream_);
  for (int64_t e = 0; e < e_count; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - begin;
    if (n == 0) continue;
    const Weight wg = row_block(experts.gate_up, e * 2 * ff, ff), wu = row_block(experts.gate_up, e * 2 * ff + ff, ff);
    const MatmulOutput gate_up[] = {{&wg, nullptr, gate + begin * ff}, {&wu, nullptr, up + begin * ff}};
    matmul_many(xg + begin * hidden, n, gate_up);
  }
  launch_swiglu(gate, up, pairs * ff, gate, stream_);
  for (int64_t e = 0; e < e_count; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - begin;
    if (n == 0) continue;
    const Weight wd = row_block(experts.down, e * hidden, hidden);
    matmul(gate + begin * ff, n, wd, nullptr, y + begin * hidden);
  }
  launch_moe_combine(y, hidden, plan_dev + pairs, route_weights, tokens, top_k, out, stream_);
}

}  // namespace ninfer::cuda
