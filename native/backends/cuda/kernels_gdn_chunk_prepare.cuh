// The chunk-parallel half of the chunked gated delta rule (see kernels_gdn_chunked.cuh): for
// every (chunk, value head) at once, the decays, P, and W, U by solving (I + A) X = B in fp32.
#pragma once

#include "backends/cuda/kernels_gdn_chunked.cuh"
#include "backends/cuda/kernels_mma_tf32.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kPrepareThreads = 256;  // 8 warps

template <int DK>
struct PrepareSmem {
  static constexpr int kQkPitch = DK + 4;     // K, Q rows (fragments walk rows by g)
  static constexpr int kAPitch = kChunk + 4;  // rows of Aᵀ, 16-byte aligned for float4 reads
  // V (pitch dv + 4) replaces Q once Q is spent: the region fits the larger of the two.
  __host__ __device__ static constexpr int q_region(int dv) {
    return kChunk * (kQkPitch > dv + 4 ? kQkPitch : dv + 4);
  }
  __host__ __device__ static constexpr size_t floats(int dv) {
    return size_t(kChunk) * kQkPitch + size_t(q_region(dv)) + size_t(kChunk) * kAPitch + 3 * size_t(kChunk);
  }
};

// Grid (chunks of the step, value heads), kPrepareThreads threads, PrepareSmem<DK>::floats(dv)
// * 4 bytes of dynamic shared memory. Writes the chunk's ChunkWorkspace.
template <int DK>
__global__ void __launch_bounds__(kPrepareThreads, 2)
    gdn_chunk_prepare(GdnDims shape, DeltaRuleArgs args, const GdnSeq* __restrict__ seqs, int num_seqs,
                      float* __restrict__ workspace) {
  constexpr int KP = PrepareSmem<DK>::kQkPitch, AP = PrepareSmem<DK>::kAPitch;
  extern __shared__ __align__(16) float smem[];
  const int dv = shape.value_dim, hv = shape.value_heads;
  const int VP = dv + 4;
  float* Ks = smem;                                   // [64][KP] raw fp32
  float* Qs = Ks + kChunk * KP;                       // [64][KP], then V [64][VP]
  float* Vs = Qs;
  float* At = Qs + PrepareSmem<DK>::q_region(dv);     // [64][AP] Aᵀ (A is zero on and above the diagonal)
  float* Gs = At + kChunk * AP;  // [64] G (cumulative log decay)
  float* betas = Gs + kChunk;    // [64] (0 past the chunk's end)
  float* eG = betas + kChunk;    // [64] e^G

  const int j = blockIdx.x, h = blockIdx.y;
  const ChunkRef ref = find_chunk(seqs, num_seqs, j);
  if (ref.seq < 0) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int hk = h / (hv / shape.key_heads);
  const int len = ref.len;
  const int64_t row0 = int64_t(seqs[ref.seq].row_begin) + ref.start;
  const ChunkWorkspace layout{DK, dv};
  float* ws = workspace + (int64_t(j) * hv + h) * layout.floats();

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
  cp_async_wait_all();
  __syncthreads();

  // K Kᵀ (warps 0-3, into A) and Q Kᵀ (warps 4-7, into P): warp owns rows 16 mt.. of all 64
  // columns; tiles wholly above the diagonal are skipped (masked to zero).
  {
    const int mt = warp & 3;
    const bool is_a = warp < 4;
    const float* X = (is_a ? Ks : Qs) + mt * 16 * KP;
    float acc[8][4] = {};
#pragma unroll 2
    for (int kk = 0; kk < DK / 8; ++kk) {
      uint32_t a[4];
      load_a<true>(a, X + kk * 8, KP, g, t);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt <= 2 * mt + 1) {
          uint32_t b[2];
          load_b_transposed<true>(b, Ks + nt * 8 * KP + kk * 8, KP, g, t);
          mma_tf32(acc[nt], a, b);
        }
      }
    }
    float* P = ws + layout.p();
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + 8 * half, s = nt * 8 + 2 * t;
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = s + e;
          const float x = acc[nt][2 * half + e];
          if (is_a)
            v[e] = c < r ? betas[r] * x * expf(Gs[r] - Gs[c]) : 0.0f;
          else
            v[e] = c <= r && r < len ? round_tf32(x * expf(Gs[r] - Gs[c])) : 0.0f;
        }
        if (is_a) {  // stored transposed: the solve reads A by columns
          At[s * AP + r] = v[0];
          At[(s + 1) * AP + r] = v[1];
        } else
          *reinterpret_cast<float2*>(P + r * kChunk + s) = make_float2(v[0], v[1]);
      }
    }
  }
  __syncthreads();  // Q is spent: V takes its place
  for (int i = tid; i < kChunk * (dv / 4); i += kPrepareThreads) {
    const int r = i / (dv / 4), c = (i % (dv / 4)) * 4;
    const bool valid = r < len;
    cp_async16(Vs + r * VP + c, args.v + (row0 + (valid ? r : 0)) * args.v_stride + int64_t(h) * dv + c, valid);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  // (I + A) X = B by forward substitution, one column per thread with the column in registers:
  // columns [0, DK) are W (B = beta e^G K), the next dv are U (B = beta V). Rows past the
  // chunk's end have B = 0 and A = 0, so they stay 0. Column by column of A (x_s is final once
  // the columns before it are applied), in blocks of 4 rows (A_rs = 0 for r <= s, so the first
  // block's extra rows lose nothing).
  for (int col = tid; col < DK + dv; col += kPrepareThreads) {
    float x[kChunk];
    if (col < DK) {
#pragma unroll
      for (int r = 0; r < kChunk; ++r) x[r] = betas[r] * eG[r] * Ks[r * KP + col];
    } else {
#pragma unroll
      for (int r = 0; r < kChunk; ++r) x[r] = betas[r] * Vs[r * VP + col - DK];
    }
#pragma unroll
    for (int s = 0; s < kChunk - 1; ++s) {
#pragma unroll
      for (int r = (s + 1) & ~3; r < kChunk; r += 4) {
        const float4 a = *reinterpret_cast<const float4*>(At + s * AP + r);
        x[r] -= a.x * x[s];
        x[r + 1] -= a.y * x[s];
        x[r + 2] -= a.z * x[s];
        x[r + 3] -= a.w * x[s];
      }
    }
    if (col < DK) {
      float* W = ws + layout.w() + col;
#pragma unroll
      for (int r = 0; r < kChunk; ++r) W[r * DK] = round_tf32(x[r]);
    } else {
      float* U = ws + layout.u() + (col - DK);
#pragma unroll
      for (int r = 0; r < kChunk; ++r) U[int64_t(r) * dv] = x[r];
    }
  }
}

}  // namespace ninfer::cuda::kernels
