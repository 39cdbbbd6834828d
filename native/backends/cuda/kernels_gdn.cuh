// Gated DeltaNet kernels: causal conv1d + SiLU with carried state, per-head L2 norm, the gates,
// and the token-by-token gated delta rule over fp32 recurrent states.
#pragma once

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/launchers_hybrid.h"

namespace ninfer::cuda::kernels {

inline constexpr int kConvChannelsPerBlock = 128;
inline constexpr int kConvTokensPerBlock = 64;

// Grid (channel tiles, sequences, token tiles). Each thread owns one channel of one token tile
// and slides a window of the K-1 previous inputs (from x, or from the carried state before the
// sequence's first row). Reads of x and state only: the state update is a second kernel.
template <int K>
__global__ void causal_conv1d_silu(const float* __restrict__ x, int64_t x_stride, int64_t channels,
                                   const float* __restrict__ weight, const GdnSeq* __restrict__ seqs,
                                   float* __restrict__ out, int64_t out_stride) {
  const int64_t c = blockIdx.x * int64_t(kConvChannelsPerBlock) + threadIdx.x;
  const GdnSeq seq = seqs[blockIdx.y];
  const int t0 = blockIdx.z * kConvTokensPerBlock;
  if (c >= channels || t0 >= seq.num_tokens) return;
  const int t1 = min(seq.num_tokens, t0 + kConvTokensPerBlock);
  const float* state = seq.conv_state;
  float w[K];
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = weight[c * K + j];
  float window[K];  // window[K-1] is the current token's input
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int p = t0 - (K - 1) + j;  // position relative to the sequence start
    window[j] = p >= 0 ? x[(seq.row_begin + p) * x_stride + c] : state[(K - 1 + p) * channels + c];
  }
  for (int t = t0; t < t1; ++t) {
    window[K - 1] = x[(seq.row_begin + t) * x_stride + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += w[j] * window[j];
    out[(seq.row_begin + t) * out_stride + c] = acc / (1.0f + expf(-acc));
    if (seq.conv_history) {  // the state after token t: its K-1 latest inputs
#pragma unroll
      for (int r = 0; r < K - 1; ++r) seq.conv_history[(static_cast<int64_t>(t) * (K - 1) + r) * channels + c] = window[r + 1];
    }
#pragma unroll
    for (int j = 0; j < K - 1; ++j) window[j] = window[j + 1];
  }
}

// Grid (channel tiles, sequences): the state becomes the last K-1 inputs. Row r of the new
// state is input position n-(K-1)+r: from x when >= 0, else old state row r+n. Ascending r
// reads each old row before any write can reach it.
template <int K>
__global__ void conv_state_update(const float* __restrict__ x, int64_t x_stride, int64_t channels,
                                  const GdnSeq* __restrict__ seqs) {
  const int64_t c = blockIdx.x * int64_t(kConvChannelsPerBlock) + threadIdx.x;
  const GdnSeq seq = seqs[blockIdx.y];
  if (c >= channels || seq.num_tokens <= 0) return;
  float* state = seq.conv_state;
  const int n = seq.num_tokens;
#pragma unroll
  for (int r = 0; r < K - 1; ++r) {
    const int p = n - (K - 1) + r;
    state[r * channels + c] = p >= 0 ? x[(seq.row_begin + p) * x_stride + c] : state[(r + n) * channels + c];
  }
}

// One warp per (token, head).
__global__ void l2norm_heads(float* x, int64_t row_stride, int64_t tokens, int64_t heads, int64_t head_dim, float scale,
                             float eps) {
  const int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (item >= tokens * heads) return;
  const int lane = threadIdx.x & 31;
  float* v = x + (item / heads) * row_stride + (item % heads) * head_dim;
  float sum = 0.0f;
  for (int64_t i = lane; i < head_dim; i += 32) sum += v[i] * v[i];
  sum = warp_sum(sum);
  const float inv = scale * rsqrtf(sum + eps);
  for (int64_t i = lane; i < head_dim; i += 32) v[i] *= inv;
}

__global__ void gdn_gates(const float* __restrict__ b, int64_t b_stride, const float* __restrict__ a, int64_t a_stride,
                          int64_t tokens, int64_t heads, const float* __restrict__ A_log,
                          const float* __restrict__ dt_bias, float* __restrict__ beta, float* __restrict__ g) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * heads) return;
  const int64_t t = i / heads, h = i % heads;
  beta[i] = 1.0f / (1.0f + expf(-b[t * b_stride + h]));
  const float s = a[t * a_stride + h] + dt_bias[h];
  const float softplus = s > 20.0f ? s : log1pf(expf(s));
  g[i] = -expf(A_log[h]) * softplus;
}

// Grid (value_dim / 32 column tiles, value heads, sequences), 128 threads: warp w holds rows
// [w*ROWS, (w+1)*ROWS) of 32 state columns in registers (dk = 4*ROWS), so the state is read and
// written once per call however many tokens the sequence has. Per token:
//   S <- exp(g) S;  kv = S^T k;  delta = beta (v - kv);  S <- S + k delta^T;  o = S^T q
// with the dk sums reduced across the 4 warps through shared memory.
template <int ROWS>
__global__ void __launch_bounds__(128) gated_delta_rule_recurrent(GdnDims shape, DeltaRuleArgs args,
                                                                  const GdnSeq* __restrict__ seqs) {
  constexpr int kDk = 4 * ROWS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = blockIdx.y;
  const int col = blockIdx.x * 32 + lane;
  const GdnSeq seq = seqs[blockIdx.z];
  const int dv = shape.value_dim, hv = shape.value_heads;
  const int hk = h / (hv / shape.key_heads);
  float* state = seq.ssm_state + static_cast<int64_t>(h) * kDk * dv;
  float s[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) s[r] = state[static_cast<int64_t>(warp * ROWS + r) * dv + col];

  __shared__ float qs[kDk], ks[kDk], partial[4][32];
  for (int t = 0; t < seq.num_tokens; ++t) {
    const int64_t row = seq.row_begin + t;
    const float* qrow = args.q + row * args.qk_stride + static_cast<int64_t>(hk) * kDk;
    const float* krow = args.k + row * args.qk_stride + static_cast<int64_t>(hk) * kDk;
    for (int i = threadIdx.x; i < kDk; i += 128) {
      qs[i] = qrow[i];
      ks[i] = krow[i];
    }
    const float v = args.v[row * args.v_stride + static_cast<int64_t>(h) * dv + col];
    const float decay = expf(args.g[row * hv + h]);
    const float beta = args.beta[row * hv + h];
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      s[r] *= decay;
      kv += s[r] * ks[warp * ROWS + r];
    }
    partial[warp][lane] = kv;
    __syncthreads();
    const float delta = beta * (v - (partial[0][lane] + partial[1][lane] + partial[2][lane] + partial[3][lane]));
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      s[r] += ks[warp * ROWS + r] * delta;
      o += s[r] * qs[warp * ROWS + r];
    }
    __syncthreads();  // every warp has read partial[] (kv) before it is reused
    partial[warp][lane] = o;
    __syncthreads();
    if (warp == 0)
      args.out[row * args.out_stride + static_cast<int64_t>(h) * dv + col] =
          partial[0][lane] + partial[1][lane] + partial[2][lane] + partial[3][lane];
    if (seq.ssm_history) {
      float* snap = seq.ssm_history + (static_cast<int64_t>(t) * hv + h) * kDk * dv;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) snap[static_cast<int64_t>(warp * ROWS + r) * dv + col] = s[r];
    }
    __syncthreads();  // qs/ks/partial are rewritten by the next token
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) state[static_cast<int64_t>(warp * ROWS + r) * dv + col] = s[r];
}

}  // namespace ninfer::cuda::kernels
