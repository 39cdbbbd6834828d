// Host entry points of the fused decode MoE kernels (kernels_moe_decode.cuh): the whole sparse
// MoE MLP of a decode batch in three launches, over expert weights in their stored format
// (bf16, FP8 with 128x128 block scales, NVFP4 with per-16 e4m3 and per-row f32 scales):
//   1. route:   router GEMV (+ the shared expert's gate row) spread over ~(experts / 8) blocks a
//               token, then softmax / top-k / renormalise in the token's last block;
//   2. gate_up: every selected expert's gate and up rows and the shared expert's, SiLU(g)·u;
//   3. down:    every selected expert's down rows, weighted by its routing weight and summed in
//               slot order, plus sigmoid(shared gate) times the shared expert's down rows.
// No host round trip: the expert ids stay on the device, so the launches go into step graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ninfer::cuda {

inline constexpr int32_t kMoeDecodeMaxTokens = 4096;  // tokens a job may have (moe_decode_supported)

enum class MoeWeightFormat : int32_t { BF16 = 0, FP8 = 1, NVFP4 = 2 };

// One weight on the device, possibly a stack of expert matrices (backends/backend.h's Weight).
struct MoeWeightRef {
  const uint8_t* codes = nullptr;  // row 0 of this weight: bf16 values, e4m3 codes or packed e2m1
  const void* scales = nullptr;    // fp8: f32 [groups, row_blocks, col_blocks]; nvfp4: e4m3 [rows, k/16]
  const float* scale2 = nullptr;   // nvfp4: f32 per row of the whole tensor
  int32_t format = 0;              // MoeWeightFormat
  int32_t group_rows = 1;          // fp8: rows of one matrix of the stack (block rows restart)
  int32_t first_row = 0;           // row of the whole tensor that `codes` starts at
  int32_t k = 0;                   // columns
};

struct MoeDecodeJob {
  const float* x = nullptr;  // [tokens, hidden]
  int32_t tokens = 0, hidden = 0;
  // Routing (launch_moe_decode_route writes ids, weights and shared_gate_logit; a caller with
  // its own routing passes them in and calls only the expert launches).
  MoeWeightRef router;                // [experts, hidden]
  MoeWeightRef shared_gate_row;       // [1, hidden], or codes nullptr: no shared gate
  int32_t num_experts = 0, top_k = 0;
  bool renormalize = true;
  int32_t* expert_ids = nullptr;      // [tokens, top_k]
  float* route_weights = nullptr;     // [tokens, top_k]
  float* shared_gate_logit = nullptr; // [tokens]
  float* route_logits = nullptr;      // scratch [tokens, experts] (route only)
  uint32_t* route_arrivals = nullptr; // [tokens], all 0 before the first route launch; each launch leaves them 0
  // Routed experts: gate_up [E·2ff, hidden] (gate rows then up rows per expert), down [E·hidden, ff].
  MoeWeightRef gate_up, down;
  int32_t ff = 0;
  // The shared expert: gate/up [shared_ff, hidden], down [hidden, shared_ff]; shared_ff 0: none.
  MoeWeightRef shared_gate, shared_up, shared_down;
  int32_t shared_ff = 0;
  float* act = nullptr;  // scratch [tokens·top_k·ff + tokens·shared_ff]
  float* out = nullptr;  // [tokens, hidden], overwritten
};

// Whether the fused kernels take this job's shapes: every weight's k a multiple of its format's
// 16-byte chunk (8 bf16, 16 fp8, 32 nvfp4 columns), at most 512 experts, top_k <= 32, and the
// staged activations within shared memory.
bool moe_decode_supported(const MoeDecodeJob& job);

// Floats of job.act the launches need.
size_t moe_decode_act_floats(const MoeDecodeJob& job);

// overlap: launched overlapping the previous kernel of the stream (launch_overlapped.h).
void launch_moe_decode_route(const MoeDecodeJob& job, bool overlap, cudaStream_t stream);
void launch_moe_decode_gate_up(const MoeDecodeJob& job, bool overlap, cudaStream_t stream);
void launch_moe_decode_down(const MoeDecodeJob& job, bool overlap, cudaStream_t stream);

}  // namespace ninfer::cuda
