// Host entry point of the grouped MoE expert GEMMs (kernels_moe_grouped.cuh): routing plan,
// gate+up with fused SwiGLU and down projection of every routed (token, slot) pair in five
// launches and no host round trip, so it also runs inside captured step graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ninfer::cuda {

struct MoeGroupedJob {
  const float* x = nullptr;             // [tokens, hidden]
  int64_t tokens = 0;
  int64_t hidden = 0;
  const int32_t* expert_ids = nullptr;  // [tokens, top_k] (launch_moe_route_softmax_topk)
  const float* route_weights = nullptr; // [tokens, top_k]
  int64_t top_k = 0;
  int64_t num_experts = 0;
  int64_t ff = 0;
  const uint16_t* gate_up = nullptr;    // bf16 [E·2ff, hidden]: gate rows then up rows per expert
  const uint16_t* down = nullptr;       // bf16 [E·hidden, ff]
  float* out = nullptr;                 // [tokens, hidden]: the weighted expert outputs are added
  // GEMM tile: rows 32, 64 or 128 by 128 weight rows (tile_cols 0 or 128), or 128 by 256;
  // tile_rows 0 picks 128 x 256 or 32 x 128 by the average rows per expert.
  int tile_rows = 0;
  int tile_cols = 0;
};

// hidden and ff multiples of 8 (16-byte copies), at most 512 experts.
bool moe_grouped_supported(int64_t hidden, int64_t ff, int64_t num_experts);

// The tile rows the job runs with (job.tile_rows, or the automatic choice's).
int moe_grouped_tile_rows(const MoeGroupedJob& job);

// Device scratch the job needs (bf16 input, plan, bf16 SwiGLU rows, fp32 per-pair outputs).
size_t moe_grouped_scratch_bytes(const MoeGroupedJob& job);

// out[t] += Σ_s w[t, s] · down_e(silu(gate_e x[t]) ⊙ up_e x[t]), e = expert_ids[t, s], in slot
// order. bf16 GEMM inputs, fp32 accumulation. Deterministic: the same inputs give the same bits.
void launch_moe_grouped_experts(const MoeGroupedJob& job, void* scratch, cudaStream_t stream);

}  // namespace ninfer::cuda
