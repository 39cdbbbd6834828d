// The chunk-parallel half of the chunked gated delta rule (see kernels_gdn_chunked.cuh): for
// every (chunk, key head) at once, the bf16 copies of Q and Kᵀ the scan multiplies with, and
// for each value head reading that key head the decays, P, T = (I + A)^-1 and
// W = T (beta e^G K), U = T (beta V). All products on tensor cores: K Kᵀ, Q Kᵀ, W and U in tf32, the blocked
// inverse in 3xtf32 (split operands, ~fp32 accuracy: T multiplies everything after it).
#pragma once

#include "backends/cuda/kernels_gdn_chunked.cuh"
#include "backends/cuda/kernels_mma.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kPrepareThreads = 256;  // 8 warps

template <int DK>
struct PrepareSmem {
  static constexpr int kQkPitch = DK + 4;     // K, Q rows (fragments walk rows by g)
  static constexpr int kAPitch = kChunk + 4;  // rows of A and T
  static constexpr int kXPitch = 24;          // a warp's 16x16 scratch, read as a B operand
  // V (pitch dv + 4) replaces Q once Q is spent: the region fits the larger of the two.
  __host__ __device__ static constexpr int q_region(int dv) {
    return kChunk * (kQkPitch > dv + 4 ? kQkPitch : dv + 4);
  }
  __host__ __device__ static constexpr size_t floats(int dv) {
    return size_t(kChunk) * kQkPitch + size_t(q_region(dv)) + 2 * size_t(kChunk) * kAPitch + 4 * 16 * kXPitch +
           3 * size_t(kChunk);
  }
};

// d += a b at about fp32 accuracy: a_hi b_hi + a_hi b_lo + a_lo b_hi with x = x_hi + x_lo in tf32.
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  uint32_t a_hi[4], a_lo[4], b_hi[2], b_lo[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a_hi[i] = tf32_bits(__uint_as_float(a[i]));
    a_lo[i] = tf32_bits(__uint_as_float(a[i]) - __uint_as_float(a_hi[i]));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    b_hi[i] = tf32_bits(__uint_as_float(b[i]));
    b_lo[i] = tf32_bits(__uint_as_float(b[i]) - __uint_as_float(b_hi[i]));
  }
  mma_tf32(d, a_lo, b_hi);
  mma_tf32(d, a_hi, b_lo);
  mma_tf32(d, a_hi, b_hi);
}

// T = (I + A)^-1 for the strictly lower A [64][AP] in 16x16 blocks: the diagonal blocks
// D_i = (I + A_ii)^-1 by forward substitution (a lane per column), then by distance from the
// diagonal T_ij = -D_i sum_{k=j}^{i-1} A_ik T_kj (a warp per block). Call with all threads;
// barriers inside. Xs: 4 warps' 16 x kXPitch scratch.
template <int DK>
__device__ __forceinline__ void invert_unit_lower(const float* As, float* Ts, float* Xs) {
  constexpr int AP = PrepareSmem<DK>::kAPitch, XP = PrepareSmem<DK>::kXPitch;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  if (warp < 4 && lane < 16) {
    const int base = warp * 16;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) x[r] = r == lane ? 1.0f : 0.0f;
#pragma unroll
    for (int s = 0; s < 15; ++s)
#pragma unroll
      for (int r = s + 1; r < 16; ++r) x[r] -= As[(base + r) * AP + base + s] * x[s];
#pragma unroll
    for (int r = 0; r < 16; ++r) Ts[(base + r) * AP + base + lane] = x[r];
  } else if (warp >= 4) {  // the blocks above the diagonal are 0
    for (int i = tid - 128; i < kChunk * kChunk; i += kPrepareThreads - 128) {
      const int r = i / kChunk, c = i % kChunk;
      if (c / 16 > r / 16) Ts[r * AP + c] = 0.0f;
    }
  }
  __syncthreads();
  float* X = Xs + warp * 16 * XP;
  for (int d = 1; d < 4; ++d) {
    if (warp < 4 - d) {
      const int jb = warp, ib = warp + d;
      float acc[2][4] = {};
      for (int kb = jb; kb < ib; ++kb)
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          uint32_t a[4];
          load_a<false>(a, As + ib * 16 * AP + kb * 16 + ks * 8, AP, g, t);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t b[2];
            load_b<false>(b, Ts + (kb * 16 + ks * 8) * AP + jb * 16 + nt * 8, AP, g, t);
            mma_3xtf32(acc[nt], a, b);
          }
        }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) X[(g + 8 * (e >> 1)) * XP + nt * 8 + 2 * t + (e & 1)] = acc[nt][e];
      __syncwarp();
      float y[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t a[4];
        load_a<false>(a, Ts + ib * 16 * AP + ib * 16 + ks * 8, AP, g, t);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          uint32_t b[2];
          load_b<false>(b, X + ks * 8 * XP + nt * 8, XP, g, t);
          mma_3xtf32(y[nt], a, b);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Ts[(ib * 16 + g + 8 * (e >> 1)) * AP + jb * 16 + nt * 8 + 2 * t + (e & 1)] = -y[nt][e];
    }
    __syncthreads();
  }
}

// W = T diag(beta e^G) K and U = T diag(beta) V into the workspace: warp w owns rows 16 (w % 4)..
// and every other 8-column tile from w / 4. Rows past the chunk's end: T has the identity there
// and beta = 0, so they are 0.
template <int DK>
__device__ __forceinline__ void write_w_and_u(const float* Ts, const float* Ks, const float* Vs, const float* betas,
                                              const float* eG, int dv, float* ws, const ChunkWorkspace& layout) {
  constexpr int KP = PrepareSmem<DK>::kQkPitch, AP = PrepareSmem<DK>::kAPitch;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int mt = warp & 3, VP = dv + 4;
  // T's rows 16 mt.. with column k scaled, as A fragments (a0, a1: column 8kk + t; a2, a3: + 4).
  auto scaled_t = [&](uint32_t (&a)[kChunk / 8][4], bool with_decay) {
#pragma unroll
    for (int kk = 0; kk < kChunk / 8; ++kk) {
      uint32_t raw[4];
      load_a<false>(raw, Ts + mt * 16 * AP + kk * 8, AP, g, t);
      const int k0 = kk * 8 + t, k1 = k0 + 4;
      const float s0 = with_decay ? betas[k0] * eG[k0] : betas[k0];
      const float s1 = with_decay ? betas[k1] * eG[k1] : betas[k1];
      a[kk][0] = tf32_bits(__uint_as_float(raw[0]) * s0);
      a[kk][1] = tf32_bits(__uint_as_float(raw[1]) * s0);
      a[kk][2] = tf32_bits(__uint_as_float(raw[2]) * s1);
      a[kk][3] = tf32_bits(__uint_as_float(raw[3]) * s1);
    }
  };
  {
    uint32_t a[kChunk / 8][4];
    scaled_t(a, true);
    auto* W = reinterpret_cast<__nv_bfloat162*>(ws + layout.w());
    for (int nt = warp >> 2; nt < DK / 8; nt += 2) {
      float acc[4] = {};
#pragma unroll
      for (int kk = 0; kk < kChunk / 8; ++kk) {
        uint32_t b[2];
        load_b<true>(b, Ks + kk * 8 * KP + nt * 8, KP, g, t);
        mma_tf32(acc, a[kk], b);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + 8 * half;
        W[(r * DK + nt * 8 + 2 * t) / 2] = __floats2bfloat162_rn(acc[2 * half], acc[2 * half + 1]);
      }
    }
  }
  {
    uint32_t a[kChunk / 8][4];
    scaled_t(a, false);
    float* U = ws + layout.u();
    for (int nt = warp >> 2; nt < dv / 8; nt += 2) {
      float acc[4] = {};
#pragma unroll
      for (int kk = 0; kk < kChunk / 8; ++kk) {
        uint32_t b[2];
        load_b<true>(b, Vs + kk * 8 * VP + nt * 8, VP, g, t);
        mma_tf32(acc, a[kk], b);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + 8 * half;
        *reinterpret_cast<float2*>(U + int64_t(r) * dv + nt * 8 + 2 * t) = make_float2(acc[2 * half], acc[2 * half + 1]);
      }
    }
  }
}

// Grid (key heads, chunks of the step), kPrepareThreads threads, PrepareSmem<DK>::floats(dv) * 4
// bytes of dynamic shared memory. A block loads its key head's K and Q once, multiplies K Kᵀ and
// Q Kᵀ once (kept in registers) and writes the key part; then, for each value head that reads
// this key head, the decays, A and P, T, W and U.
template <int DK>
__global__ void __launch_bounds__(kPrepareThreads, 2)
    gdn_chunk_prepare(GdnDims shape, DeltaRuleArgs args, const GdnSeq* __restrict__ seqs, int num_seqs,
                      float* __restrict__ workspace) {
  constexpr int KP = PrepareSmem<DK>::kQkPitch, AP = PrepareSmem<DK>::kAPitch;
  extern __shared__ __align__(16) float smem[];
  const int dv = shape.value_dim, hv = shape.value_heads;
  const int VP = dv + 4;
  float* Ks = smem;                                    // [64][KP] raw fp32
  float* Qs = Ks + kChunk * KP;                        // [64][KP], then V [64][VP]
  float* Vs = Qs;
  float* As = Qs + PrepareSmem<DK>::q_region(dv);      // [64][AP] A (zero on and above the diagonal)
  float* Ts = As + kChunk * AP;                        // [64][AP] T = (I + A)^-1
  float* Xs = Ts + kChunk * AP;                        // [4][16][kXPitch] scratch of the inverse
  float* Gs = Xs + 4 * 16 * PrepareSmem<DK>::kXPitch;  // [64] G (cumulative log decay)
  float* betas = Gs + kChunk;                          // [64] (0 past the chunk's end)
  float* eG = betas + kChunk;                          // [64] e^G

  const int hk = blockIdx.x, j = blockIdx.y;
  const ChunkRef ref = find_chunk(seqs, num_seqs, j);
  if (ref.seq < 0) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int ratio = hv / shape.key_heads;
  const int len = ref.len;
  const int64_t row0 = int64_t(seqs[ref.seq].row_begin) + ref.start;
  const ChunkWorkspace layout{shape.key_heads, hv, DK, dv};

  // K and Q rows of the chunk, zeros past its end (they then contribute nothing).
  constexpr int kVecs = DK / 4;
  for (int i = tid; i < kChunk * kVecs; i += kPrepareThreads) {
    const int r = i / kVecs, c = (i % kVecs) * 4;
    const bool valid = r < len;
    const int64_t src = (row0 + (valid ? r : 0)) * args.qk_stride + int64_t(hk) * DK + c;
    cp_async16(Ks + r * KP + c, args.k + src, valid);
    cp_async16(Qs + r * KP + c, args.q + src, valid);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  {  // the key part: bf16 Q and Kᵀ
    auto* qb = reinterpret_cast<__nv_bfloat162*>(workspace + layout.key_part(j, hk) + layout.q());
    auto* ktb = reinterpret_cast<__nv_bfloat162*>(workspace + layout.key_part(j, hk) + layout.kt());
    for (int i = tid; i < kChunk * DK / 2; i += kPrepareThreads) {
      const int r = i / (DK / 2), d = (i % (DK / 2)) * 2;  // Q pair (r, d..d+1)
      qb[i] = __floats2bfloat162_rn(Qs[r * KP + d], Qs[r * KP + d + 1]);
      const int kd = i / (kChunk / 2), kr = (i % (kChunk / 2)) * 2;  // Kᵀ pair (d, r..r+1)
      ktb[i] = __floats2bfloat162_rn(Ks[kr * KP + kd], Ks[(kr + 1) * KP + kd]);
    }
  }

  // K Kᵀ (warps 0-3) and Q Kᵀ (warps 4-7): warp owns rows 16 mt.. of all 64 columns; tiles
  // wholly above the diagonal are skipped (masked to zero). Kept for every value head.
  const int mt = warp & 3;
  const bool is_a = warp < 4;
  float raw[8][4] = {};
  {
    const float* X = (is_a ? Ks : Qs) + mt * 16 * KP;
#pragma unroll 2
    for (int kk = 0; kk < DK / 8; ++kk) {
      uint32_t a[4];
      load_a<true>(a, X + kk * 8, KP, g, t);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt <= 2 * mt + 1) {
          uint32_t b[2];
          load_b_transposed<true>(b, Ks + nt * 8 * KP + kk * 8, KP, g, t);
          mma_tf32(raw[nt], a, b);
        }
      }
    }
  }
  __syncthreads();  // Q is spent: V takes its place, head by head

  for (int head = 0; head < ratio; ++head) {
    const int h = hk * ratio + head;
    float* ws = workspace + layout.value_part(j, h);
    // V lands while the decays, A and T are computed.
    for (int i = tid; i < kChunk * (dv / 4); i += kPrepareThreads) {
      const int r = i / (dv / 4), c = (i % (dv / 4)) * 4;
      const bool valid = r < len;
      cp_async16(Vs + r * VP + c, args.v + (row0 + (valid ? r : 0)) * args.v_stride + int64_t(h) * dv + c, valid);
    }
    cp_async_commit();
    if (warp == 0) {  // inclusive scan of g over the chunk, two halves of 32
      float lo = lane < len ? args.g[(row0 + lane) * hv + h] : 0.0f;
      float hi = lane + 32 < len ? args.g[(row0 + lane + 32) * hv + h] : 0.0f;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float a = __shfl_up_sync(0xffffffffu, lo, off), b = __shfl_up_sync(0xffffffffu, hi, off);
        if (lane >= off) {
          lo += a;
          hi += b;
        }
      }
      hi += __shfl_sync(0xffffffffu, lo, 31);
      const float last = __shfl_sync(0xffffffffu, len - 1 < 32 ? lo : hi, (len - 1) & 31);
      Gs[lane] = lo;
      Gs[lane + 32] = hi;
      betas[lane] = lane < len ? args.beta[(row0 + lane) * hv + h] : 0.0f;
      betas[lane + 32] = lane + 32 < len ? args.beta[(row0 + lane + 32) * hv + h] : 0.0f;
      eG[lane] = expf(lo);
      eG[lane + 32] = expf(hi);
      ws[layout.decay() + lane] = expf(lo);
      ws[layout.decay() + lane + 32] = expf(hi);
      ws[layout.tail() + lane] = lane < len ? expf(last - lo) : 0.0f;  // <= 1: g <= 0
      ws[layout.tail() + lane + 32] = lane + 32 < len ? expf(last - hi) : 0.0f;
    }
    __syncthreads();

    // A (warps 0-3) and P (warps 4-7) of this head from the raw products.
    {
      auto* P = reinterpret_cast<__nv_bfloat162*>(ws + layout.p());
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = mt * 16 + g + 8 * half, s = nt * 8 + 2 * t;
          float v[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = s + e;
            const float x = raw[nt][2 * half + e];
            if (is_a)
              v[e] = c < r ? betas[r] * x * expf(Gs[r] - Gs[c]) : 0.0f;
            else
              v[e] = c <= r && r < len ? x * expf(Gs[r] - Gs[c]) : 0.0f;
          }
          if (is_a)
            *reinterpret_cast<float2*>(As + r * AP + s) = make_float2(v[0], v[1]);
          else
            P[(r * kChunk + s) / 2] = __floats2bfloat162_rn(v[0], v[1]);
        }
      }
    }
    __syncthreads();
    invert_unit_lower<DK>(As, Ts, Xs);  // ends with a barrier
    cp_async_wait_all();
    __syncthreads();
    write_w_and_u<DK>(Ts, Ks, Vs, betas, eG, dv, ws, layout);
    __syncthreads();  // before the next head reuses V, A, T and the decays
  }
}

}  // namespace ninfer::cuda::kernels
