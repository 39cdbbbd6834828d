// Row norms, gates and MoE routing/combination kernels of the Qwen3.5/3.6 hybrid models.
#pragma once

#include <cfloat>

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_row_norm.cuh"

namespace ninfer::cuda::kernels {

// Sum over a block of up to 1024 threads, returned to every thread. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += scratch[w];
  return total;
}

// One block per row. ZERO_CENTERED: weight (1 + w), else w; GATED: times silu(z[row]).
template <bool ZERO_CENTERED, bool GATED>
__global__ void row_norm(const float* x, int64_t x_stride, const float* __restrict__ z, int64_t dim,
                         const float* __restrict__ weight, float eps, float* out, int64_t out_stride) {
  allow_dependent_launch();  // the next GEMV (GDN out_proj) may start streaming its weights
  wait_for_prerequisite_grids();  // when launched overlapping the delta rule
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * x_stride;
  float* yr = out + blockIdx.x * out_stride;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) sum += xr[c] * xr[c];
  const float inv = rsqrtf(block_sum(sum, scratch) / static_cast<float>(dim) + eps);
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float y = xr[c] * inv * (ZERO_CENTERED ? 1.0f + weight[c] : weight[c]);
    if constexpr (GATED) {
      const float g = z[blockIdx.x * dim + c];
      y *= g / (1.0f + expf(-g));
    }
    yr[c] = y;
  }
}

// row_norm with a warp a row (row_norm_warp_values): the hybrids' per-head norms have rows of
// 128 or 256 (up to 393k of them in an 8k prefill), too short to keep a block of their own busy.
template <bool ZERO_CENTERED, bool GATED, int kVec>
__global__ void row_norm_warps(const float* x, int64_t x_stride, const float* __restrict__ z, int64_t rows,
                               const float* __restrict__ weight, float eps, float* out, int64_t out_stride) {
  allow_dependent_launch();  // the next GEMV (GDN out_proj) may start streaming its weights
  wait_for_prerequisite_grids();  // when launched overlapping the delta rule
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  float4 y[kVec];
  row_norm_warp_values<ZERO_CENTERED, GATED, kVec>(x + row * x_stride, GATED ? z + row * 128 * kVec : nullptr,
                                                   weight, eps, lane, y);
  float4* yr = reinterpret_cast<float4*>(out + row * out_stride);
#pragma unroll
  for (int i = 0; i < kVec; ++i) yr[lane + 32 * i] = y[i];
}

__global__ void split_query_gate(const float* __restrict__ in, int64_t total, int64_t head_dim,
                                 float* __restrict__ query, float* __restrict__ gate) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // over tokens*heads*head_dim
  if (i >= total) return;
  const int64_t th = i / head_dim, d = i % head_dim;
  query[i] = in[th * 2 * head_dim + d];
  gate[i] = in[th * 2 * head_dim + head_dim + d];
}

__global__ void sigmoid_gate_multiply(float* x, const float* __restrict__ gate, int64_t n) {
  allow_dependent_launch();  // the next GEMV (o_proj) may start streaming its weights
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

// One warp per token; lane l holds experts l, l+32, ... (PER_LANE of them, compile-time so the
// array stays in registers). Top-k by repeated warp arg-max, ties to the lower expert id.
template <int PER_LANE>
__global__ void moe_route_softmax_topk(const float* __restrict__ logits, int64_t tokens, int experts, int top_k,
                                       bool renormalize, int32_t* __restrict__ expert_ids,
                                       float* __restrict__ weights) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= tokens) return;
  const int lane = threadIdx.x & 31;
  float p[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? logits[t * experts + e] : -FLT_MAX;
  }
  const float sum = warp_softmax_numerators(p, lane, experts);
  float chosen_sum = 0.0f, my_weight = 0.0f;
  int my_id = 0;
  for (int k = 0; k < top_k; ++k) {
    float best;
    int best_id;
    warp_take_largest(p, lane, best, best_id);
    const float prob = best / sum;
    chosen_sum += prob;
    if (lane == k) {
      my_weight = prob;
      my_id = best_id;
    }
  }
  if (lane < top_k) {
    expert_ids[t * top_k + lane] = my_id;
    weights[t * top_k + lane] = renormalize ? my_weight / chosen_sum : my_weight;
  }
}

__global__ void moe_combine(const float* __restrict__ rows, int64_t hidden, const int32_t* __restrict__ row_of,
                            const float* __restrict__ weights, int64_t tokens, int top_k, float* __restrict__ out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden, c = i % hidden;
  float acc = out[i];
  for (int s = 0; s < top_k; ++s) {
    const int64_t pair = t * top_k + s;
    acc += weights[pair] * rows[static_cast<int64_t>(row_of ? row_of[pair] : pair) * hidden + c];
  }
  out[i] = acc;
}

__global__ void moe_add_gated_shared(const float* __restrict__ shared, const float* __restrict__ gate_logit,
                                     int64_t tokens, int64_t hidden, float* __restrict__ out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * hidden) return;
  out[i] += shared[i] / (1.0f + expf(-gate_logit[i / hidden]));
}

inline constexpr int kMoeGemvWarps = 8;

// Expert matmul of every (token, slot) pair without grouping (decode): block (row tile, pair p)
// computes y[p, r] = W[ids[p] * expert_rows + r, :] . bf16(x[token(p), :]) for kMoeGemvWarps
// rows, one warp per row with 16-byte weight loads. token(p) = p / top_k, or p when x holds one
// row per pair. The expert id is read on the device: no host round trip.
__global__ void __launch_bounds__(kMoeGemvWarps * 32)
    moe_gemv(const uint16_t* __restrict__ w, int64_t expert_rows, int rows_out, int k, const int32_t* __restrict__ ids,
             int top_k, const float* __restrict__ x, bool x_per_pair, float* __restrict__ y) {
  extern __shared__ float xs[];
  const int p = blockIdx.y;
  const float* xr = x + static_cast<int64_t>(x_per_pair ? p : p / top_k) * k;
  for (int i = threadIdx.x; i < k; i += blockDim.x) xs[i] = round_bf16(xr[i]);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kMoeGemvWarps + (threadIdx.x >> 5);
  if (row >= rows_out) return;
  const uint16_t* wr = w + (static_cast<int64_t>(ids[p]) * expert_rows + row) * k;
  float acc = 0.0f;
#pragma unroll 4
  for (int c = lane * 8; c < k; c += 256) {
    float f[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(wr + c), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += f[j] * xs[c + j];
  }
  acc = warp_sum(acc);
  if (lane == 0) y[static_cast<int64_t>(p) * rows_out + row] = acc;
}

// out[p, j] = silu(in[p, j]) * in[p, ff + j]: the gate | up halves of a fused projection.
__global__ void swiglu_halves(const float* __restrict__ in, int64_t rows, int64_t ff, float* __restrict__ out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * ff) return;
  const int64_t r = i / ff, j = i % ff;
  const float g = in[r * 2 * ff + j];
  out[i] = g / (1.0f + expf(-g)) * in[r * 2 * ff + ff + j];
}

__global__ void concat_columns(const float* __restrict__ a, int64_t a_cols, const float* __restrict__ b,
                               int64_t b_cols, int64_t rows, float* __restrict__ out) {
  const int64_t width = a_cols + b_cols;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t r = i / width, c = i % width;
  out[i] = c < a_cols ? a[r * a_cols + c] : b[r * b_cols + (c - a_cols)];
}

}  // namespace ninfer::cuda::kernels
