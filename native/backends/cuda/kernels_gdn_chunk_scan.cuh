// The sequential half of the chunked gated delta rule (see kernels_gdn_chunked.cuh): one block
// per (tile of NT state columns, value head, sequence) walks the sequence's chunks in order,
// with its dk x NT slice of the state in registers (exact fp32) and a bf16 copy of it in shared
// memory as the operand of the next chunk's products. Per chunk, on bf16 tensor cores:
//   1. [W; Q] S (128 x NT): the W rows give V' = U - W S, the Q rows O' = e^G (Q S);
//   2. O = O' + P V' (Q warps) and S <- e^{G_last} S + Kᵀ (e^{G_last-G} V') (all warps).
// The chunk's operands (W, Q, Kᵀ, P in bf16; U, decays in fp32) come from the prepare kernel's
// workspace through two shared-memory stages: chunk c+1's copies are issued when chunk c starts,
// so their latency hides behind a whole chunk of work. Two barriers a chunk.
#pragma once

#include "backends/cuda/kernels_gdn_chunked.cuh"
#include "backends/cuda/kernels_mma.cuh"

namespace ninfer::cuda::kernels {

// NT state columns per block, 8 warps per 32 columns: warp w owns rows 16 (w % 8).. of the
// 128-row products and columns 32 (w / 8).. of the tile. Offsets in bytes; bf16 pitches of
// 8 mod 64 elements (fragment reads on 32 different banks).
template <int DK, int NT>
struct ScanShape {
  static constexpr int kWarps = 8 * NT / 32;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowPitch = DK + 8;       // bf16 [64][DK] (W, Q) and Sᵀ [NT][DK]
  static constexpr int kTokenPitch = kChunk + 8;  // bf16 [.][64] (Kᵀ, P, V'ᵀ)
  static constexpr int kUPitch = NT + 8;          // fp32 U [64][NT]
  // One stage: a chunk's operands.
  static constexpr int kW = 0;
  static constexpr int kQ = kW + kChunk * kRowPitch * 2;
  static constexpr int kKt = kQ + kChunk * kRowPitch * 2;
  static constexpr int kP = kKt + DK * kTokenPitch * 2;
  static constexpr int kU = kP + kChunk * kTokenPitch * 2;
  static constexpr int kDecay = kU + kChunk * kUPitch * 4;  // e^G [64] | tail [64]
  static constexpr int kStage = kDecay + 2 * kChunk * 4;
  // After the two stages: Sᵀ, V'ᵀ, (tail V')ᵀ.
  static constexpr int kSt = 2 * kStage;
  static constexpr int kVt = kSt + NT * kRowPitch * 2;
  static constexpr int kVtt = kVt + NT * kTokenPitch * 2;
  static constexpr size_t kBytes = size_t(kVtt) + size_t(NT) * kTokenPitch * 2;
};

template <int DK, int NT>
__global__ void __launch_bounds__(ScanShape<DK, NT>::kThreads, 1)
    gdn_chunk_scan(GdnDims shape, DeltaRuleArgs args, const GdnSeq* __restrict__ seqs,
                   const float* __restrict__ workspace) {
  using L = ScanShape<DK, NT>;
  using bf16 = __nv_bfloat16;
  constexpr int RP = L::kRowPitch, TP = L::kTokenPitch, UP = L::kUPitch;
  extern __shared__ __align__(16) unsigned char scan_smem[];
  unsigned char* smem = scan_smem;
  bf16* St = reinterpret_cast<bf16*>(smem + L::kSt);
  bf16* Vt = reinterpret_cast<bf16*>(smem + L::kVt);
  bf16* Vtt = reinterpret_cast<bf16*>(smem + L::kVtt);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int mt = warp % 8, n_base = (warp / 8) * 32;  // rows 16 mt.. of [W; Q] and of S
  const bool w_rows = mt < 4;
  const bool owns_state = mt * 16 < DK;
  const int h = blockIdx.y, col0 = blockIdx.x * NT;
  const GdnSeq seq = seqs[blockIdx.z];
  const int dv = shape.value_dim, hv = shape.value_heads;
  const int hk = h / (hv / shape.key_heads);
  const ChunkWorkspace layout{shape.key_heads, hv, DK, dv};
  const int first_chunk = first_chunk_of(seqs, blockIdx.z);
  const int chunks = (seq.num_tokens + kChunk - 1) / kChunk;
  float* state = seq.ssm_state + int64_t(h) * DK * dv + col0;

  // Sᵀ[col][row] = bf16(S[row][col]) for the pairs of a C fragment.
  auto store_state_copy = [&](const float (&s)[4][4]) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = mt * 16 + g + 8 * (e >> 1), c = n_base + nt * 8 + 2 * t + (e & 1);
        St[c * RP + r] = __float2bfloat16_rn(s[nt][e]);
      }
  };

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
      }
    store_state_copy(s_reg);
  }

  auto copy_rows = [&](unsigned char* dst, int dst_pitch, const float* src, int src_pitch, int rows, int row_bytes) {
    const int vecs = row_bytes / 16;
    for (int i = tid; i < rows * vecs; i += L::kThreads) {
      const int r = i / vecs, v = i % vecs;
      cp_async16(dst + r * dst_pitch + v * 16, reinterpret_cast<const unsigned char*>(src + r * src_pitch) + v * 16,
                 true);
    }
  };
  // All of chunk c's operands into stage c % 2.
  auto load_chunk = [&](int c) {
    unsigned char* stage = smem + (c & 1) * L::kStage;
    const float* key = workspace + layout.key_part(first_chunk + c, hk);
    const float* value = workspace + layout.value_part(first_chunk + c, h);
    copy_rows(stage + L::kW, RP * 2, value + layout.w(), DK / 2, kChunk, DK * 2);
    copy_rows(stage + L::kQ, RP * 2, key + layout.q(), DK / 2, kChunk, DK * 2);
    copy_rows(stage + L::kKt, TP * 2, key + layout.kt(), kChunk / 2, DK, kChunk * 2);
    copy_rows(stage + L::kP, TP * 2, value + layout.p(), kChunk / 2, kChunk, kChunk * 2);
    copy_rows(stage + L::kU, UP * 4, value + layout.u() + col0, dv, kChunk, NT * 4);
    copy_rows(stage + L::kDecay, 0, value + layout.decay(), 0, 1, 2 * kChunk * 4);  // e^G, tail: contiguous
    cp_async_commit();
  };

  if (chunks > 0) load_chunk(0);
  for (int c = 0; c < chunks; ++c) {
    const int len = min(kChunk, seq.num_tokens - c * kChunk);
    unsigned char* stage = smem + (c & 1) * L::kStage;
    const bf16* Ws = reinterpret_cast<const bf16*>(stage + L::kW);
    const bf16* Qs = reinterpret_cast<const bf16*>(stage + L::kQ);
    const bf16* Kts = reinterpret_cast<const bf16*>(stage + L::kKt);
    const bf16* Ps = reinterpret_cast<const bf16*>(stage + L::kP);
    const float* Us = reinterpret_cast<const float*>(stage + L::kU);
    const float* eG = reinterpret_cast<const float*>(stage + L::kDecay);
    const float* tail = eG + kChunk;
    cp_async_wait_all();
    __syncthreads();  // chunk c is in, Sᵀ is current; chunk c-1 is done with the other stage
    if (c + 1 < chunks) load_chunk(c + 1);

    // 1. [W; Q] S for rows 16 mt.. and columns n_base..n_base+31.
    float acc[4][4] = {};
    {
      const bf16* X = (w_rows ? Ws : Qs) + (mt & 3) * 16 * RP;
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        uint32_t a[4];
        load_a_bf16(a, X + kk * 16, RP, g, t);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b[2];
          load_b_bf16(b, St + (n_base + nt * 8) * RP + kk * 16, RP, g, t);
          mma_bf16(acc[nt], a, b);
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
          const float2 u = *reinterpret_cast<const float2*>(Us + r * UP + cc);
          const float v0 = u.x - pair[0], v1 = u.y - pair[1];
          Vt[cc * TP + r] = __float2bfloat16_rn(v0);
          Vt[(cc + 1) * TP + r] = __float2bfloat16_rn(v1);
          Vtt[cc * TP + r] = __float2bfloat16_rn(tail[r] * v0);
          Vtt[(cc + 1) * TP + r] = __float2bfloat16_rn(tail[r] * v1);
        } else {
          pair[0] *= eG[r];
          pair[1] *= eG[r];
        }
      }
    __syncthreads();  // V' is in

    // 2a. O = e^G (Q S) + P V' (the Q warps, whose acc holds e^G Q S).
    if (!w_rows) {
      const bf16* Prow = Ps + (mt - 4) * 16 * TP;
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk) {
        uint32_t a[4];
        load_a_bf16(a, Prow + kk * 16, TP, g, t);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b[2];
          load_b_bf16(b, Vt + (n_base + nt * 8) * TP + kk * 16, TP, g, t);
          mma_bf16(acc[nt], a, b);
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
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk) {
        uint32_t a[4];
        load_a_bf16(a, Kts + mt * 16 * TP + kk * 16, TP, g, t);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b[2];
          load_b_bf16(b, Vtt + (n_base + nt * 8) * TP + kk * 16, TP, g, t);
          mma_bf16(s_reg[nt], a, b);
        }
      }
      store_state_copy(s_reg);
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
