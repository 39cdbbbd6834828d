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
// sequence's first row). With several token tiles a later tile reads the old state too, so the
// state update is a second kernel; UPDATE_STATE (one token tile: every sequence's rows of a
// channel belong to one thread, which has read its old state rows first) writes the new state
// here instead. May overlap the previous kernel (programmatic dependent launch).
template <int K, bool UPDATE_STATE>
__global__ void causal_conv1d_silu(const float* __restrict__ x, int64_t x_stride, int64_t channels,
                                   const float* __restrict__ weight, const GdnSeq* __restrict__ seqs,
                                   float* __restrict__ out, int64_t out_stride) {
  allow_dependent_launch();
  wait_for_prerequisite_grids();
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
  // The inputs of kAhead tokens are loaded before any of them is used: a thread keeps that many
  // loads in flight instead of one (the kernel is bound by memory latency, not bandwidth).
  constexpr int kAhead = 8;
  for (int t = t0; t < t1; t += kAhead) {
    float ahead[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) ahead[u] = t + u < t1 ? x[(seq.row_begin + t + u) * x_stride + c] : 0.0f;
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (t + u >= t1) break;
      window[K - 1] = ahead[u];
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < K; ++j) acc += w[j] * window[j];
      out[(seq.row_begin + t + u) * out_stride + c] = acc / (1.0f + expf(-acc));
      if (seq.conv_history) {  // the state after token t + u: its K-1 latest inputs
#pragma unroll
        for (int r = 0; r < K - 1; ++r)
          seq.conv_history[(static_cast<int64_t>(t + u) * (K - 1) + r) * channels + c] = window[r + 1];
      }
#pragma unroll
      for (int j = 0; j < K - 1; ++j) window[j] = window[j + 1];
    }
  }
  if constexpr (UPDATE_STATE) {  // window[r]: input position num_tokens - (K-1) + r (x or old state)
    float* st = seq.conv_state;
#pragma unroll
    for (int r = 0; r < K - 1; ++r) st[r * channels + c] = window[r];
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

inline constexpr int kDeltaRuleCols = 8;  // state columns per block

// Grid (value_dim / 8 column tiles, value heads, sequences), 128 threads. Thread (warp w, lane
// l) owns column l % 8 of the tile and rows [g*ROWS, (g+1)*ROWS) of it, g = 4w + l/8 (16 row
// groups, dk = 16*ROWS), in registers: the state is read and written once per call however
// many tokens the sequence has. Narrow tiles give a single long prefill 4x more blocks than
// 32-column tiles would (the per-token work is sequential and latency-bound). Per token:
//   S <- exp(g) S;  kv = S^T k;  delta = beta (v - kv);  S <- S + k delta^T;  o = S^T q
// with the dk sums reduced by shuffles within a warp and across the 4 warps through shared
// memory (three barriers a token).
//
// PREPARED (decode): q and k arrive raw (the conv's output) and the gates as the raw a/b
// projections; the kernel L2-normalises q (times gates.q_scale) and k per token and computes
// beta and g itself, with the same arithmetic as l2norm_heads and gdn_gates (three launches
// fewer a GDN layer). May overlap the previous kernel (programmatic dependent launch).
template <int ROWS, bool PREPARED>
__global__ void __launch_bounds__(128) gated_delta_rule_recurrent(GdnDims shape, DeltaRuleArgs args,
                                                                  const GdnSeq* __restrict__ seqs,
                                                                  GdnRawGates gates) {
  allow_dependent_launch();
  wait_for_prerequisite_grids();
  constexpr int kDk = 16 * ROWS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = lane & 7;
  const int row0 = (warp * 4 + (lane >> 3)) * ROWS;
  const int h = blockIdx.y;
  const int col = blockIdx.x * kDeltaRuleCols + c;
  const GdnSeq seq = seqs[blockIdx.z];
  const int dv = shape.value_dim, hv = shape.value_heads;
  const int hk = h / (hv / shape.key_heads);
  float* state = seq.ssm_state + static_cast<int64_t>(h) * kDk * dv;
  float s[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) s[r] = state[static_cast<int64_t>(row0 + r) * dv + col];

  __shared__ float qs[kDk], ks[kDk], partial_kv[4][kDeltaRuleCols], partial_o[4][kDeltaRuleCols];
  // The next token's q, k, v, g, beta are loaded into registers while this one computes, so
  // the global-memory latency overlaps the (sequential) per-token work of long prefills.
  constexpr int kPerThread = (kDk + 127) / 128;
  float qn[kPerThread], kn[kPerThread], vn = 0.0f, gn = 0.0f, bn = 0.0f;
  auto load = [&](int t) {
    const int64_t row = seq.row_begin + t;
    const float* qrow = args.q + row * args.qk_stride + static_cast<int64_t>(hk) * kDk;
    const float* krow = args.k + row * args.qk_stride + static_cast<int64_t>(hk) * kDk;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = threadIdx.x + 128 * j;
      if (i < kDk) {
        qn[j] = qrow[i];
        kn[j] = krow[i];
      }
    }
    vn = args.v[row * args.v_stride + static_cast<int64_t>(h) * dv + col];
    if constexpr (PREPARED) {
      bn = 1.0f / (1.0f + expf(-gates.b[row * gates.b_stride + h]));
      const float sp = gates.a[row * gates.a_stride + h] + gates.dt_bias[h];
      gn = -expf(gates.A_log[h]) * (sp > 20.0f ? sp : log1pf(expf(sp)));
    } else {
      gn = args.g[row * hv + h];
      bn = args.beta[row * hv + h];
    }
  };
  if (seq.num_tokens > 0) load(0);
  for (int t = 0; t < seq.num_tokens; ++t) {
    const int64_t row = seq.row_begin + t;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = threadIdx.x + 128 * j;
      if (i < kDk) {
        qs[i] = qn[j];
        ks[i] = kn[j];
      }
    }
    const float v = vn, decay = expf(gn), beta = bn;
    __syncthreads();
    if (t + 1 < seq.num_tokens) load(t + 1);
    float kr[ROWS], qr[ROWS];
    float inv_q = 1.0f, inv_k = 1.0f;
    if constexpr (PREPARED) {  // every warp sums the head itself (l2norm_heads' order): no barrier
      float sq = 0.0f, sk = 0.0f;
      for (int i = lane; i < kDk; i += 32) {
        sq += qs[i] * qs[i];
        sk += ks[i] * ks[i];
      }
      sq = warp_sum(sq);
      sk = warp_sum(sk);
      inv_q = gates.q_scale * rsqrtf(sq + gates.eps);
      inv_k = rsqrtf(sk + gates.eps);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      kr[r] = PREPARED ? ks[row0 + r] * inv_k : ks[row0 + r];
      qr[r] = PREPARED ? qs[row0 + r] * inv_q : qs[row0 + r];
    }
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      s[r] *= decay;
      kv += s[r] * kr[r];
    }
    kv += __shfl_xor_sync(0xffffffffu, kv, 8);
    kv += __shfl_xor_sync(0xffffffffu, kv, 16);
    if (lane < kDeltaRuleCols) partial_kv[warp][c] = kv;
    __syncthreads();
    const float delta = beta * (v - (partial_kv[0][c] + partial_kv[1][c] + partial_kv[2][c] + partial_kv[3][c]));
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      s[r] += kr[r] * delta;
      o += s[r] * qr[r];
    }
    o += __shfl_xor_sync(0xffffffffu, o, 8);
    o += __shfl_xor_sync(0xffffffffu, o, 16);
    if (lane < kDeltaRuleCols) partial_o[warp][c] = o;
    // After this barrier every warp is done with qs/ks and partial_kv of this token, so the
    // next token may overwrite them; partial_o is next written after the next token's second
    // barrier, which warp 0 reaches only after reading it here.
    __syncthreads();
    if (warp == 0 && lane < kDeltaRuleCols)
      args.out[row * args.out_stride + static_cast<int64_t>(h) * dv + col] =
          partial_o[0][c] + partial_o[1][c] + partial_o[2][c] + partial_o[3][c];
    if (seq.ssm_history) {
      float* snap = seq.ssm_history + (static_cast<int64_t>(t) * hv + h) * kDk * dv;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) snap[static_cast<int64_t>(row0 + r) * dv + col] = s[r];
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) state[static_cast<int64_t>(row0 + r) * dv + col] = s[r];
}

}  // namespace ninfer::cuda::kernels
