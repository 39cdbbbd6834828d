// The chunked gated delta rule (spec §3.1) for prefill: 64 tokens at a time per block instead
// of one, so the sequential dependency runs over chunks and the work inside a chunk is small
// dense products. Same math as cpu::gated_delta_rule_chunked, rearranged so a block needs only
// its own state columns:
//   G_r = sum_{s<=r} g_s (within the chunk), A_rs = beta_r (k_r.k_s) e^{G_r-G_s} (s < r),
//   (I + A) V' = beta (V - e^G K S)               (V' = U - W S of the reference, solved directly)
//   O = e^G Q S + P V',  P_rs = (q_r.k_s) e^{G_r-G_s} (s <= r)
//   S <- e^{G_last} S + sum_r e^{G_last-G_r} k_r V'_r^T
// Every state column evolves independently given q, k, g, beta, so blocks own 32-column tiles
// (more blocks for one long sequence); the k/q products are recomputed per tile. fp32 on CUDA
// cores throughout (the state is fp32; tensor cores are the next step). Two blocks fit an SM
// (109 KB of shared memory each for dk 128), so 192 blocks of a 27B layer run in one wave;
// global loads are issued all at once per phase (their latency, not the math, dominated a
// first version that loaded in a loop).
#pragma once

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/launchers_hybrid.h"

namespace ninfer::cuda::kernels {

inline constexpr int kChunk = 64;           // tokens per chunk
inline constexpr int kChunkCols = 32;       // state columns per block
inline constexpr int kChunkThreads = 256;   // 8 warps

// Shared memory of one block, in floats: K and Q chunks [64][DK+1] (P [64][65] replaces Q once
// Q is spent), A [64][65], the state tile [DK][33], X/V' [64][33], and per-token G, e^G, tail
// decay, beta.
constexpr size_t chunked_smem_floats(int dk) {
  return 2 * size_t(kChunk) * (dk + 1) + size_t(kChunk) * (kChunk + 1) + size_t(dk) * (kChunkCols + 1) +
         size_t(kChunk) * (kChunkCols + 1) + 4 * size_t(kChunk);
}

// Grid (value_dim / 32, value heads, sequences), 256 threads, chunked_smem_floats(DK) * 4 bytes
// of dynamic shared memory.
template <int DK>
__global__ void __launch_bounds__(kChunkThreads, 2) gated_delta_rule_chunked(GdnDims shape, DeltaRuleArgs args,
                                                                          const GdnSeq* __restrict__ seqs) {
  constexpr int KP = DK + 1, AP = kChunk + 1, SP = kChunkCols + 1;
  extern __shared__ float smem[];
  float* Ks = smem;                    // [64][KP]
  float* Qs = Ks + kChunk * KP;        // [64][KP]
  float* Ps = Qs;                      // [64][AP]  P (lower incl. diagonal, with decay), after Q
  float* As = Qs + kChunk * KP;        // [64][AP]  A (strictly lower, with beta and decay)
  float* Ss = As + kChunk * AP;        // [DK][SP]  state tile
  float* Xs = Ss + DK * SP;            // [64][SP]  X, then V' after the solve
  float* Gs = Xs + kChunk * SP;        // [64] cumulative log decay
  float* eG = Gs + kChunk;             // [64] e^{G_r}
  float* tail = eG + kChunk;           // [64] e^{G_last - G_r}
  float* betas = tail + kChunk;        // [64]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y;
  const int col0 = blockIdx.x * kChunkCols;
  const GdnSeq seq = seqs[blockIdx.z];
  const int dv = shape.value_dim, hv = shape.value_heads;
  const int hk = h / (hv / shape.key_heads);
  float* state = seq.ssm_state + static_cast<int64_t>(h) * DK * dv + col0;

  constexpr int kStateLoads = DK * kChunkCols / kChunkThreads;
  {
    float sbuf[kStateLoads];
#pragma unroll
    for (int j = 0; j < kStateLoads; ++j) {
      const int i = tid + j * kChunkThreads;
      sbuf[j] = state[static_cast<int64_t>(i / kChunkCols) * dv + i % kChunkCols];
    }
#pragma unroll
    for (int j = 0; j < kStateLoads; ++j) {
      const int i = tid + j * kChunkThreads;
      Ss[(i / kChunkCols) * SP + i % kChunkCols] = sbuf[j];
    }
  }

  for (int start = 0; start < seq.num_tokens; start += kChunk) {
    const int len = min(kChunk, seq.num_tokens - start);
    const int64_t row0 = seq.row_begin + start;
    __syncthreads();  // the previous chunk is done with Ks, Xs and the decays
    // Load the chunk (zeros past its end: they then contribute nothing anywhere), every load
    // in flight before the first store.
    // (In four batches, halves of K then of Q, so the buffers fit the register budget.)
    for (int m = 0; m < 4; ++m) {
      const float* src = ((m & 2) ? args.q : args.k) + static_cast<int64_t>(hk) * DK;
      float* dst = (m & 2) ? Qs : Ks;
      const int first = (m & 1) * (kChunk / 2);
      constexpr int kLoads = kChunk / 2 * DK / kChunkThreads;
      float buf[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int i = tid + j * kChunkThreads, r = first + i / DK, d = i % DK;
        buf[j] = r < len ? src[(row0 + r) * args.qk_stride + d] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int i = tid + j * kChunkThreads;
        dst[(first + i / DK) * KP + i % DK] = buf[j];
      }
    }
    if (warp == 0) {  // inclusive scan of g over the 64 tokens, two halves of 32
      const float g_lo = lane < len ? args.g[(row0 + lane) * hv + h] : 0.0f;
      const float g_hi = lane + 32 < len ? args.g[(row0 + lane + 32) * hv + h] : 0.0f;
      float lo = g_lo, hi = g_hi;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float a = __shfl_up_sync(0xffffffffu, lo, off), b = __shfl_up_sync(0xffffffffu, hi, off);
        if (lane >= off) {
          lo += a;
          hi += b;
        }
      }
      hi += __shfl_sync(0xffffffffu, lo, 31);
      Gs[lane] = lo;
      Gs[lane + 32] = hi;
      betas[lane] = lane < len ? args.beta[(row0 + lane) * hv + h] : 0.0f;
      betas[lane + 32] = lane + 32 < len ? args.beta[(row0 + lane + 32) * hv + h] : 0.0f;
      const float last = __shfl_sync(0xffffffffu, (len - 1) < 32 ? lo : hi, (len - 1) & 31);
      eG[lane] = expf(lo);
      eG[lane + 32] = expf(hi);
      tail[lane] = expf(last - lo);  // <= 1 for r < len; rows past len have k = 0
      tail[lane + 32] = expf(last - hi);
    }
    __syncthreads();

    // K S and Q S for this tile: thread owns column c and rows rg + 8i.
    const int c = tid & 31, rg = tid >> 5;
    float o[8];
    {
      float vbuf[8];  // issued before the products so their latency overlaps them
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = rg + 8 * i;
        vbuf[i] = r < len ? args.v[(row0 + r) * args.v_stride + static_cast<int64_t>(h) * dv + col0 + c] : 0.0f;
      }
      float ks[8] = {}, qs[8] = {};
#pragma unroll 4
      for (int d = 0; d < DK; ++d) {
        const float s = Ss[d * SP + c];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          ks[i] += Ks[(rg + 8 * i) * KP + d] * s;
          qs[i] += Qs[(rg + 8 * i) * KP + d] * s;
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = rg + 8 * i;
        Xs[r * SP + c] = betas[r] * (vbuf[i] - eG[r] * ks[i]);
        o[i] = eG[r] * qs[i];
      }
    }

    // A and P (after Q S: P is stored over Q): thread owns rows rt + 16i and columns st + 16j
    // (conflict-free K reads).
    {
      const int rt = tid >> 4, st = tid & 15;
      float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll 4
      for (int d = 0; d < DK; ++d) {
        float kr[4], qr[4], ks[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          kr[i] = Ks[(rt + 16 * i) * KP + d];
          qr[i] = Qs[(rt + 16 * i) * KP + d];
          ks[i] = Ks[(st + 16 * i) * KP + d];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            kk[i][j] += kr[i] * ks[j];
            qk[i][j] += qr[i] * ks[j];
          }
      }
      __syncthreads();  // every thread is done reading Q: P may overwrite it
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = rt + 16 * i, s = st + 16 * j;
          const float decay = s <= r ? expf(Gs[r] - Gs[s]) : 0.0f;
          As[r * AP + s] = s < r ? betas[r] * kk[i][j] * decay : 0.0f;
          Ps[r * AP + s] = qk[i][j] * decay;
        }
    }

    __syncthreads();

    // Forward substitution V'_r = X_r - sum_{s<r} A_rs V'_s: lane l of warp 0 solves column l
    // in place in Xs (it reads only its own column, so no barrier inside; A reads are
    // broadcasts, Xs reads conflict-free). Rows past len have X = 0 and A = 0: they stay 0.
    if (warp == 0) {
      for (int r = 1; r < len; ++r) {
        float acc0 = 0.0f, acc1 = 0.0f;
        int s = 0;
#pragma unroll 4
        for (; s + 1 < r; s += 2) {
          acc0 += As[r * AP + s] * Xs[s * SP + lane];
          acc1 += As[r * AP + s + 1] * Xs[(s + 1) * SP + lane];
        }
        if (s < r) acc0 += As[r * AP + s] * Xs[s * SP + lane];
        Xs[r * SP + lane] -= acc0 + acc1;
      }
    }
    __syncthreads();

    // O = e^G Q S + P V'.
#pragma unroll 4
    for (int s = 0; s < len; ++s) {
      const float vs = Xs[s * SP + c];
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] += Ps[(rg + 8 * i) * AP + s] * vs;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = rg + 8 * i;
      if (r < len) args.out[(row0 + r) * args.out_stride + static_cast<int64_t>(h) * dv + col0 + c] = o[i];
    }

    // S <- e^{G_last} S + sum_r tail_r k_r V'_r^T: thread owns column c and rows rg + 8i of S.
    {
      constexpr int kRows = DK / 8;
      const float chunk_decay = eG[len - 1];
      float acc[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) acc[i] = chunk_decay * Ss[(rg + 8 * i) * SP + c];
#pragma unroll 4
      for (int r = 0; r < len; ++r) {
        const float y = tail[r] * Xs[r * SP + c];
#pragma unroll
        for (int i = 0; i < kRows; ++i) acc[i] += Ks[r * KP + rg + 8 * i] * y;
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) Ss[(rg + 8 * i) * SP + c] = acc[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kStateLoads; ++j) {
    const int i = tid + j * kChunkThreads;
    state[static_cast<int64_t>(i / kChunkCols) * dv + i % kChunkCols] = Ss[(i / kChunkCols) * SP + i % kChunkCols];
  }
}

}  // namespace ninfer::cuda::kernels
