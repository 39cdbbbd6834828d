// The chunked gated delta rule (spec §3.1) for prefill, in two kernels (the split of
// flash-linear-attention's chunked form): tokens in chunks of 64, per chunk (value head h,
// G_r = sum_{s<=r} g_s inside the chunk, T = (I + A)^-1 with A_rs = beta_r (k_r.k_s) e^{G_r-G_s}
// for s < r):
//   W = T (beta e^G K),  U = T (beta V),  P_rs = (q_r.k_s) e^{G_r-G_s} (s <= r)
// depend on the chunk's own tokens only: gdn_chunk_prepare computes them for every chunk at
// once (kernels_gdn_chunk_prepare.cuh). What is left is sequential over chunks, per value head
// and tile of state columns (kernels_gdn_chunk_scan.cuh):
//   V' = U - W S,  O = e^G (Q S) + P V',  S <- e^{G_last} S + K^T (e^{G_last-G} V')
// Same math as cpu::gated_delta_rule_chunked. The prepare kernel runs K Kᵀ, Q Kᵀ, W and U on
// tf32 tensor cores and the blocked inverse T in 3xtf32 (~fp32); the scan's products take bf16
// operands (W, Q, K, P, and the fp32 state and V' rounded) with fp32 accumulation, so that a
// chunk's operands fit shared memory twice (the next chunk's copies overlap this chunk's work).
#pragma once

#include "backends/cuda/launchers_hybrid.h"

namespace ninfer::cuda::kernels {

inline constexpr int kChunk = kGdnChunk;  // tokens per chunk

// The workspace, per chunk: a key part per key head, Q [64][dk] and Kᵀ [dk][64] in bf16 (the
// scan's tensor-core operands), then a value part per value head: W [64][dk] and P [64][64] in
// bf16, U [64][dv], e^G [64] and e^{G_last-G} [64] (0 past the chunk's last token) in fp32.
// Offsets in floats (a bf16 pair per float); every part starts 16-byte aligned.
struct ChunkWorkspace {
  int key_heads, value_heads, dk, dv;
  __host__ __device__ constexpr int64_t key_floats() const { return int64_t(kChunk) * dk; }
  __host__ __device__ constexpr int64_t value_floats() const { return tail() + kChunk; }
  __host__ __device__ constexpr int64_t chunk_floats() const {
    return key_heads * key_floats() + value_heads * value_floats();
  }
  // Within a key part.
  __host__ __device__ constexpr int64_t q() const { return 0; }
  __host__ __device__ constexpr int64_t kt() const { return int64_t(kChunk / 2) * dk; }
  // Within a value part.
  __host__ __device__ constexpr int64_t w() const { return 0; }
  __host__ __device__ constexpr int64_t p() const { return int64_t(kChunk / 2) * dk; }
  __host__ __device__ constexpr int64_t u() const { return p() + kChunk * kChunk / 2; }
  __host__ __device__ constexpr int64_t decay() const { return u() + int64_t(kChunk) * dv; }
  __host__ __device__ constexpr int64_t tail() const { return decay() + kChunk; }

  __host__ __device__ constexpr int64_t key_part(int chunk, int hk) const {
    return chunk * chunk_floats() + hk * key_floats();
  }
  __host__ __device__ constexpr int64_t value_part(int chunk, int h) const {
    return chunk * chunk_floats() + key_heads * key_floats() + h * value_floats();
  }
};

// Global chunk j of a step: chunks are numbered sequence by sequence, ceil(num_tokens / 64)
// each. seq < 0 when j is past the last one.
struct ChunkRef {
  int seq = -1;
  int start = 0;  // first token of the chunk within its sequence
  int len = 0;    // tokens in the chunk, 1..64
};

__device__ inline ChunkRef find_chunk(const GdnSeq* seqs, int num_seqs, int j) {
  int first = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const int n = seqs[i].num_tokens, count = (n + kChunk - 1) / kChunk;
    if (j < first + count) {
      const int start = (j - first) * kChunk;
      return {i, start, min(kChunk, n - start)};
    }
    first += count;
  }
  return {};
}

// The global index of sequence i's first chunk.
__device__ inline int first_chunk_of(const GdnSeq* seqs, int i) {
  int first = 0;
  for (int s = 0; s < i; ++s) first += (seqs[s].num_tokens + kChunk - 1) / kChunk;
  return first;
}

}  // namespace ninfer::cuda::kernels
