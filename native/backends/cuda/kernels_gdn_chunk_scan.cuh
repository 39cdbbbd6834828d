// The sequential half of the chunked gated delta rule (see kernels_gdn_chunked.cuh): one block
// per (tile of NT state columns, value head, sequence) walks the sequence's chunks in order,
// with its dk x NT slice of the state in registers (exact fp32) and a tf32 copy in shared memory
// as the operand of the next chunk's products. Per chunk, on tensor cores:
//   1. [W; Q] S (128 x NT): the W rows give V' = U - W S, the Q rows O' = e^G (Q S);
//   2. O = O' + P V' (Q warps) and S <- e^{G_last} S + Kᵀ (e^{G_last-G} V') (all warps).
// Copies into shared memory are cp.async, issued as soon as the previous chunk is done with a
// buffer: W, Q, U and the decays of chunk c+1 during step 2 of chunk c, K and P of chunk c during
// its step 1. Two barriers a chunk.
#pragma once

#include "backends/cuda/kernels_gdn_chunked.cuh"
#include "backends/cuda/kernels_mma_tf32.cuh"

namespace ninfer::cuda::kernels {

// NT state columns per block, 8 warps per 32 columns: warp w owns rows 16 (w % 8).. of the
// 128-row products and columns 32 (w / 8).. of the tile.
template <int DK, int NT>
struct ScanShape {
  static constexpr int kWarps = 8 * NT / 32;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWqPitch = DK + 4;    // W, Q: A operands walked by g
  static constexpr int kKPitch = DK + 8;     // K: the transposed A operand, walked by t
  static constexpr int kPPitch = kChunk + 4;
  static constexpr int kColPitch = NT + 8;   // U, V', S: B operands walked by t
  static constexpr int kW = 0;
  static constexpr int kQ = kW + kChunk * kWqPitch;
  static constexpr int kU = kQ + kChunk * kWqPitch;
  static constexpr int kDecay = kU + kChunk * kColPitch;  // [2 buffers][e^G 64 | tail 64]
  static constexpr int kK = kDecay + 4 * kChunk;
  static constexpr int kP = kK + kChunk * kKPitch;
  static constexpr int kV = kP + kChunk * kPPitch;          // V' (tf32)
  static constexpr int kVt = kV + kChunk * kColPitch;       // e^{G_last-G} V' (tf32)
  static constexpr int kS = kVt + kChunk * kColPitch;       // S (tf32)
  static constexpr size_t kFloats = size_t(kS) + size_t(DK) * kColPitch;
};

template <int DK, int NT>
__global__ void __launch_bounds__(ScanShape<DK, NT>::kThreads, 1)
    gdn_chunk_scan(GdnDims shape, DeltaRuleArgs args, const GdnSeq* __restrict__ seqs,
                   const float* __restrict__ workspace) {
  using L = ScanShape<DK, NT>;
  constexpr int WQP = L::kWqPitch, KP = L::kKPitch, PP = L::kPPitch, CP = L::kColPitch;
  extern __shared__ __align__(16) float smem[];
  float* Ws = smem + L::kW;
  float* Qs = smem + L::kQ;
  float* Us = smem + L::kU;
  float* decays = smem + L::kDecay;
  float* Ks = smem + L::kK;
  float* Ps = smem + L::kP;
  float* Vs = smem + L::kV;
  float* Vts = smem + L::kVt;
  float* Ss = smem + L::kS;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int mt = warp % 8, n_base = (warp / 8) * 32;  // rows 16 mt.. of [W; Q] and of S
  const bool w_rows = mt < 4;
  const bool owns_state = mt * 16 < DK;
  const int h = blockIdx.y, col0 = blockIdx.x * NT;
  const GdnSeq seq = seqs[blockIdx.z];
  const int dv = shape.value_dim, hv = shape.value_heads;
  const int hk = h / (hv / shape.key_heads);
  const ChunkWorkspace layout{DK, dv};
  const int first_chunk = first_chunk_of(seqs, blockIdx.z);
  const int chunks = (seq.num_tokens + kChunk - 1) / kChunk;
  float* state = seq.ssm_state + int64_t(h) * DK * dv + col0;

  // The state slice in C-fragment order: rows 16 mt + g (+8), columns n_base + 8 nt + 2t (+1).
  float s_reg[4][4] = {};
  if (owns_state) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + 8 * half, c = n_base + nt * 8 + 2 * t;
        const float2 v = *reinterpret_cast<const float2*>(state + int64_t(r) * dv + c);
        s_reg[nt][2 * half] = v.x;
        s_reg[nt][2 * half + 1] = v.y;
        *reinterpret_cast<float2*>(Ss + r * CP + c) = make_float2(round_tf32(v.x), round_tf32(v.y));
      }
  }

  auto chunk_ws = [&](int c) { return workspace + (int64_t(first_chunk + c) * hv + h) * layout.floats(); };
  auto chunk_len = [&](int c) { return min(kChunk, seq.num_tokens - c * kChunk); };
  // Rows of q/k of chunk c: zeros past its end.
  auto load_rows = [&](float* dst, int pitch, const float* src, int c) {
    const int len = chunk_len(c);
    const int64_t row0 = int64_t(seq.row_begin) + c * kChunk;
    constexpr int kVecs = DK / 4;
    for (int i = tid; i < kChunk * kVecs; i += L::kThreads) {
      const int r = i / kVecs, k = (i % kVecs) * 4;
      const bool valid = r < len;
      cp_async16(dst + r * pitch + k, src + (row0 + (valid ? r : 0)) * args.qk_stride + int64_t(hk) * DK + k, valid);
    }
  };
  auto load_wqu = [&](int c) {
    const float* ws = chunk_ws(c);
    constexpr int kWVecs = DK / 4, kUVecs = NT / 4;
    for (int i = tid; i < kChunk * kWVecs; i += L::kThreads) {
      const int r = i / kWVecs, k = (i % kWVecs) * 4;
      cp_async16(Ws + r * WQP + k, ws + layout.w() + r * DK + k, true);
    }
    load_rows(Qs, WQP, args.q + 0, c);
    for (int i = tid; i < kChunk * kUVecs; i += L::kThreads) {
      const int r = i / kUVecs, k = (i % kUVecs) * 4;
      cp_async16(Us + r * CP + k, ws + layout.u() + int64_t(r) * dv + col0 + k, true);
    }
    if (tid < 2 * kChunk / 4) {  // e^G then tail, contiguous in the workspace
      float* dst = decays + (c & 1) * 2 * kChunk + tid * 4;
      cp_async16(dst, ws + layout.decay() + tid * 4, true);
    }
    cp_async_commit();
  };
  auto load_kp = [&](int c) {
    const float* ws = chunk_ws(c);
    load_rows(Ks, KP, args.k, c);
    constexpr int kPVecs = kChunk / 4;
    for (int i = tid; i < kChunk * kPVecs; i += L::kThreads) {
      const int r = i / kPVecs, k = (i % kPVecs) * 4;
      cp_async16(Ps + r * PP + k, ws + layout.p() + r * kChunk + k, true);
    }
    cp_async_commit();
  };

  if (chunks > 0) load_wqu(0);
  for (int c = 0; c < chunks; ++c) {
    const int len = chunk_len(c);
    const float* eG = decays + (c & 1) * 2 * kChunk;
    const float* tail = eG + kChunk;
    cp_async_wait_all();
    __syncthreads();  // W, Q, U of c and S are in; chunk c-1 is done with K, P, V'
    load_kp(c);

    // 1. [W; Q] S for rows 16 mt.. and columns n_base..n_base+31.
    float acc[4][4] = {};
    {
      const float* X = (w_rows ? Ws : Qs) + (mt & 3) * 16 * WQP;
#pragma unroll 4
      for (int kk = 0; kk < DK / 8; ++kk) {
        uint32_t a[4];
        load_a<true>(a, X + kk * 8, WQP, g, t);  // W is tf32 already (rounding is then exact)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b[2];
          load_b<false>(b, Ss + kk * 8 * CP + n_base + nt * 8, CP, g, t);
          mma_tf32(acc[nt], a, b);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = (mt & 3) * 16 + g + 8 * half, cc = n_base + nt * 8 + 2 * t;
        float* pair = acc[nt] + 2 * half;
        if (w_rows) {
          const float2 u = *reinterpret_cast<const float2*>(Us + r * CP + cc);
          const float v0 = u.x - pair[0], v1 = u.y - pair[1];
          *reinterpret_cast<float2*>(Vs + r * CP + cc) = make_float2(round_tf32(v0), round_tf32(v1));
          *reinterpret_cast<float2*>(Vts + r * CP + cc) =
              make_float2(round_tf32(tail[r] * v0), round_tf32(tail[r] * v1));
        } else {
          pair[0] *= eG[r];
          pair[1] *= eG[r];
        }
      }
    cp_async_wait_all();
    __syncthreads();  // V' and K, P of c are in; W, Q, U of c are spent
    if (c + 1 < chunks) load_wqu(c + 1);

    // 2a. O = e^G (Q S) + P V' (the Q warps, whose acc holds e^G Q S).
    if (!w_rows) {
      const float* Prow = Ps + (mt - 4) * 16 * PP;
#pragma unroll 2
      for (int kk = 0; kk < kChunk / 8; ++kk) {
        uint32_t a[4];
        load_a<false>(a, Prow + kk * 8, PP, g, t);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b[2];
          load_b<false>(b, Vs + kk * 8 * CP + n_base + nt * 8, CP, g, t);
          mma_tf32(acc[nt], a, b);
        }
      }
      const int64_t row0 = int64_t(seq.row_begin) + c * kChunk;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = (mt - 4) * 16 + g + 8 * half;
          if (r < len)
            *reinterpret_cast<float2*>(args.out + (row0 + r) * args.out_stride + int64_t(h) * dv + col0 + n_base +
                                       nt * 8 + 2 * t) = make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
        }
    }

    // 2b. S <- e^{G_last} S + Kᵀ (tail V'): rows 16 mt.. of S.
    if (owns_state) {
      const float chunk_decay = eG[len - 1];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_reg[nt][e] *= chunk_decay;
#pragma unroll 2
      for (int kk = 0; kk < kChunk / 8; ++kk) {
        uint32_t a[4];
        load_a_transposed<true>(a, Ks + kk * 8 * KP + mt * 16, KP, g, t);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b[2];
          load_b<false>(b, Vts + kk * 8 * CP + n_base + nt * 8, CP, g, t);
          mma_tf32(s_reg[nt], a, b);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = mt * 16 + g + 8 * half, cc = n_base + nt * 8 + 2 * t;
          *reinterpret_cast<float2*>(Ss + r * CP + cc) =
              make_float2(round_tf32(s_reg[nt][2 * half]), round_tf32(s_reg[nt][2 * half + 1]));
        }
    }
  }

  if (owns_state) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + 8 * half, c = n_base + nt * 8 + 2 * t;
        *reinterpret_cast<float2*>(state + int64_t(r) * dv + c) = make_float2(s_reg[nt][2 * half], s_reg[nt][2 * half + 1]);
      }
  }
}

}  // namespace ninfer::cuda::kernels
