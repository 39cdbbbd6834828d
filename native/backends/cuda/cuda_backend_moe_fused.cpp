// The MoE MLP of decode batches in three launches (launchers_moe_decode.h), and the CUDA
// backend's handling of quantized expert stacks: they stay in their stored format on the device;
// decode reads them quantized (the fused kernels), larger batches dequantize each stack into a
// bf16 scratch for the grouped tensor-core GEMMs (prefill: once per layer and chunk).
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers_moe_decode.h"
#include "backends/cuda/launchers_quant.h"

namespace ninfer::cuda {

namespace {

// (token, slot) pairs up to which the fused kernels run (the per-pair GEMV's limit,
// cuda_backend_moe.cpp): above it the grouped GEMMs read each used expert once instead of once
// per pair.
constexpr int64_t kFusedPairs = 128;

// Read per call (a step's signature notes the choice) so a benchmark can compare both forms
// in one process.
bool fused_enabled() {
  const char* v = std::getenv("NINFER_MOE_FUSED");
  return !(v && std::strcmp(v, "0") == 0);
}

bool readable(DType t) { return t == DType::BF16 || t == DType::FP8 || t == DType::NVFP4; }

MoeWeightRef ref_of(const Weight& w) {
  MoeWeightRef r;
  r.codes = static_cast<const uint8_t*>(w.data);
  r.scales = w.scales;
  r.scale2 = w.scale2;
  r.format = static_cast<int32_t>(w.dtype == DType::FP8     ? MoeWeightFormat::FP8
                                  : w.dtype == DType::NVFP4 ? MoeWeightFormat::NVFP4
                                                            : MoeWeightFormat::BF16);
  r.group_rows = static_cast<int32_t>(w.group_rows > 0 ? w.group_rows : w.rows);
  r.first_row = static_cast<int32_t>(w.first_row);
  r.k = static_cast<int32_t>(w.cols);
  return r;
}

template <typename T>
T* scratch_of(DeviceScratch& s, int64_t elements, cudaStream_t stream) {
  return static_cast<T*>(s.get(static_cast<size_t>(elements > 0 ? elements : 1) * sizeof(T), stream));
}

// The routed experts of a job (no router, no shared expert yet).
MoeDecodeJob experts_job(const float* x, int64_t tokens, int64_t hidden, const MoeExperts& experts, float* out) {
  MoeDecodeJob job;
  job.x = x;
  job.tokens = static_cast<int32_t>(tokens);
  job.hidden = static_cast<int32_t>(hidden);
  job.num_experts = static_cast<int32_t>(experts.num_experts);
  job.top_k = static_cast<int32_t>(experts.top_k);
  job.renormalize = experts.renormalize;
  job.gate_up = ref_of(experts.gate_up);
  job.down = ref_of(experts.down);
  job.ff = static_cast<int32_t>(experts.ff);
  job.out = out;
  return job;
}

bool int32_fits(int64_t v) { return v >= 0 && v < (int64_t(1) << 31); }

}  // namespace

bool CudaBackend::moe_mlp_fused(const float* x, int64_t tokens, int64_t hidden, const MoeMlp& mlp, float* out) {
  if (!fused_enabled() || !mlp.experts || !mlp.router || !mlp.gate || !mlp.up || !mlp.down) return false;
  if (moe_path_ != MoePath::Auto && moe_path_ != MoePath::Gemv) return false;
  const MoeExperts& experts = *mlp.experts;
  if (tokens <= 0 || tokens * experts.top_k > kFusedPairs) return false;
  if (experts.held_experts() != experts.num_experts) return false;  // expert parallelism: the ops
  experts.check(hidden);
  for (const Weight* w : {&experts.gate_up, &experts.down, mlp.router, mlp.gate, mlp.up, mlp.down})
    if (!readable(w->dtype) || !int32_fits(w->rows)) return false;
  if (mlp.router->rows != experts.num_experts || mlp.router->cols != hidden) return false;
  if (mlp.gate->rows != mlp.shared_ff || mlp.up->rows != mlp.shared_ff || mlp.down->rows != hidden) return false;
  const bool gated = mlp.shared_gate && *mlp.shared_gate;
  if (gated && (!readable(mlp.shared_gate->dtype) || mlp.shared_gate->rows != 1 || mlp.shared_gate->cols != hidden))
    return false;
  MoeDecodeJob job = experts_job(x, tokens, hidden, experts, out);
  job.router = ref_of(*mlp.router);
  if (gated) job.shared_gate_row = ref_of(*mlp.shared_gate);
  job.shared_gate = ref_of(*mlp.gate);
  job.shared_up = ref_of(*mlp.up);
  job.shared_down = ref_of(*mlp.down);
  job.shared_ff = static_cast<int32_t>(mlp.shared_ff);
  if (!moe_decode_supported(job)) return false;
  note(-41);
  note(overlap_launches_);
  if (dry()) return true;
  activate();
  const int64_t pairs = tokens * experts.top_k;
  auto* route = scratch_of<float>(moe_fused_route_, 2 * pairs + tokens + tokens * experts.num_experts, stream_);
  job.expert_ids = reinterpret_cast<int32_t*>(route);
  job.route_weights = route + pairs;
  job.shared_gate_logit = gated ? route + 2 * pairs : nullptr;
  job.route_logits = route + 2 * pairs + tokens;
  // One fixed size (the kernels' token limit), so the counters never move once zeroed.
  auto* arrivals = scratch_of<uint32_t>(moe_route_arrivals_, kMoeDecodeMaxTokens, stream_);
  if (arrivals != moe_route_arrivals_zeroed_) {
    NINFER_CUDA_CHECK(cudaMemsetAsync(arrivals, 0, kMoeDecodeMaxTokens * sizeof(uint32_t), stream_));
    moe_route_arrivals_zeroed_ = arrivals;
  }
  job.route_arrivals = arrivals;
  job.act = scratch_of<float>(moe_fused_act_, static_cast<int64_t>(moe_decode_act_floats(job)), stream_);
  launch_moe_decode_route(job, overlap_launches_, stream_);
  launch_moe_decode_gate_up(job, overlap_launches_, stream_);
  launch_moe_decode_down(job, overlap_launches_, stream_);
  return true;
}

bool CudaBackend::moe_experts_quantized_gemv(const float* x, int64_t tokens, int64_t hidden, const int32_t* ids_dev,
                                             const float* route_weights, const MoeExperts& experts, float* out) {
  MoeDecodeJob job = experts_job(x, tokens, hidden, experts, out);
  job.expert_ids = const_cast<int32_t*>(ids_dev);
  job.route_weights = const_cast<float*>(route_weights);
  if (!moe_decode_supported(job)) return false;
  job.act = scratch_of<float>(moe_fused_act_, static_cast<int64_t>(moe_decode_act_floats(job)), stream_);
  launch_moe_decode_gate_up(job, overlap_launches_, stream_);
  launch_moe_decode_down(job, overlap_launches_, stream_);
  return true;
}

// The grouped and host paths (prefill) widen a layer's quantized stacks to bf16: 1.6 GB for
// the 35B-A3B shape, more than the KV pool's headroom, so they are taken before the pool.
void CudaBackend::reserve_moe_experts(const MoeExperts& experts) {
  if (dry()) return;
  activate();
  if (is_block_quantized(experts.gate_up.dtype))
    moe_bf16_gate_up_.reserve(static_cast<size_t>(experts.gate_up.rows * experts.gate_up.cols) * 2, stream_);
  if (is_block_quantized(experts.down.dtype))
    moe_bf16_down_.reserve(static_cast<size_t>(experts.down.rows * experts.down.cols) * 2, stream_);
}

MoeExperts CudaBackend::moe_experts_as_bf16(const MoeExperts& experts) {
  MoeExperts view = experts;
  auto widen = [&](const Weight& w, DeviceScratch& scratch) {
    if (!is_block_quantized(w.dtype)) return w;
    auto* dst = scratch_of<uint16_t>(scratch, w.rows * w.cols, stream_);
    const QuantGemvJob q{static_cast<const uint8_t*>(w.data), w.scales, w.scale2, nullptr, nullptr,
                         static_cast<int32_t>(w.rows), static_cast<int32_t>(w.group_rows),
                         static_cast<int32_t>(w.first_row)};
    launch_dequantize_bf16(w.dtype == DType::NVFP4, q, static_cast<int>(w.cols), dst, stream_);
    return Weight{DType::BF16, w.rows, w.cols, dst};
  };
  view.gate_up = widen(experts.gate_up, moe_bf16_gate_up_);
  view.down = widen(experts.down, moe_bf16_down_);
  return view;
}

}  // namespace ninfer::cuda
