// Causal prefill attention over the paged cache on tensor cores (bf16 WMMA, f32 accumulate).
//
// A block of 4 warps takes kPrefillBlockRows = 64 consecutive query rows of one slice and
// one query head; each warp owns 16 rows. Keys are walked one 64-token page at a time
// (FlashAttention-style online softmax): S = Q·K^T (tensor cores) -> per-row max/sum in f32
// -> P (bf16) -> O += P·V (tensor cores, O kept in accumulator fragments across tiles).
// WMMA accumulator layouts are opaque, so O cannot be rescaled per row in registers; the
// kernel keeps a stale per-row max instead and rescales (through shared memory) only when a
// row's max grows by more than kRescaleThreshold, so probabilities stay below e^8 and the
// rescale is rare after the first tile.
#pragma once

#include <mma.h>

#include <cfloat>

#include "backends/cuda/attention_plan.h"
#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_decode_attention.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kPrefillWarps = 4;
inline constexpr int kPrefillThreads = kPrefillWarps * 32;
inline constexpr int kKeyTile = 64;  // one KV page
inline constexpr float kRescaleThreshold = 8.0f;

struct PrefillParams {
  KvLayout kv;
  const int32_t* pages;
  const PrefillItem* items;
  const float* q;
  float* out;
  int num_heads;
  int group;
  float scale;
};

// Shared-memory plan of the kernel for a head dim (padded rows against bank conflicts; every
// WMMA tile pointer stays 32-byte aligned).
template <int HD>
struct PrefillSmem {
  static constexpr int kQkvLd = HD + 8;          // bf16 elements per row of Q, K, V tiles
  static constexpr int kSLd = kKeyTile + 4;       // f32 scores
  static constexpr int kPLd = kKeyTile + 8;       // bf16 probabilities
  static constexpr int kOLd = HD + 4;             // f32 output accumulator
  static constexpr size_t kQBytes = size_t(kPrefillBlockRows) * kQkvLd * 2;
  static constexpr size_t kKBytes = size_t(kKeyTile) * kQkvLd * 2;
  static constexpr size_t kSBytes = size_t(kPrefillWarps) * 16 * kSLd * 4;
  static constexpr size_t kPBytes = size_t(kPrefillWarps) * 16 * kPLd * 2;
  static constexpr size_t kOBytes = size_t(kPrefillWarps) * 16 * kOLd * 4;
  static constexpr size_t kRowBytes = size_t(kPrefillWarps) * 16 * 4;
  static constexpr size_t kQ = 0, kK = kQ + kQBytes, kV = kK + kKBytes, kS = kV + kKBytes, kP = kS + kSBytes,
                          kO = kP + kPBytes, kAlpha = kO + kOBytes, kL = kAlpha + kRowBytes, kTotal = kL + kRowBytes;
};

template <int HD>
__global__ void __launch_bounds__(kPrefillThreads) prefill_attention(const PrefillParams p) {
  using namespace nvcuda;
  using Smem = PrefillSmem<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem + Smem::kQ);
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + Smem::kK);
  __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(smem + Smem::kV);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* s_w = reinterpret_cast<float*>(smem + Smem::kS) + warp * 16 * Smem::kSLd;
  __nv_bfloat16* p_w = reinterpret_cast<__nv_bfloat16*>(smem + Smem::kP) + warp * 16 * Smem::kPLd;
  float* o_w = reinterpret_cast<float*>(smem + Smem::kO) + warp * 16 * Smem::kOLd;
  float* alpha_w = reinterpret_cast<float*>(smem + Smem::kAlpha) + warp * 16;
  float* l_w = reinterpret_cast<float*>(smem + Smem::kL) + warp * 16;

  const PrefillItem item = p.items[blockIdx.x];
  const int head = blockIdx.y;
  const int kv_head = head / p.group;
  const int last_pos = item.first_pos + item.num_rows - 1;  // the block sees keys [0, last_pos]

  // Q tile -> bf16 (rows past the block's end are zero).
  for (int idx = threadIdx.x; idx < kPrefillBlockRows * HD; idx += kPrefillThreads) {
    const int r = idx / HD, d = idx % HD;
    const float value = r < item.num_rows ? p.q[(static_cast<int64_t>(item.row + r) * p.num_heads + head) * HD + d] : 0.0f;
    q_s[r * Smem::kQkvLd + d] = __float2bfloat16_rn(value);
  }
  constexpr int kDn = HD / 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag[kDn];
#pragma unroll
  for (int dn = 0; dn < kDn; ++dn) wmma::fill_fragment(o_frag[dn], 0.0f);

  // This lane's softmax row and half of the 64 key columns.
  const int my_row = lane >> 1, my_half = lane & 1;
  const int my_pos = item.first_pos + warp * 16 + my_row;  // query position of that row
  const bool row_valid = warp * 16 + my_row < item.num_rows;
  float row_max = -FLT_MAX, row_sum = 0.0f;  // row_max: the (possibly stale) max P is relative to
  const int warp_last_pos = min(last_pos, item.first_pos + warp * 16 + 15);

  const int num_tiles = last_pos / kKeyTile + 1;
  for (int tile = 0; tile < num_tiles; ++tile) {
    __syncthreads();  // previous tile's K/V fully consumed (and Q written on entry)
    const int32_t page = p.pages[item.pages_offset + tile];
    constexpr int kChunksPerRow = HD / 8;
    for (int idx = threadIdx.x; idx < kKeyTile * kChunksPerRow; idx += kPrefillThreads) {
      const int key = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
      uint4 kvec = make_uint4(0, 0, 0, 0), vvec = make_uint4(0, 0, 0, 0);
      if (tile * kKeyTile + key <= last_pos) {  // never read slots nothing wrote (could be NaN)
        kvec = *reinterpret_cast<const uint4*>(kv_row(p.kv, page, 0, key, HD) + kv_head * HD + chunk * 8);
        vvec = *reinterpret_cast<const uint4*>(kv_row(p.kv, page, 1, key, HD) + kv_head * HD + chunk * 8);
      }
      *reinterpret_cast<uint4*>(k_s + key * Smem::kQkvLd + chunk * 8) = kvec;
      *reinterpret_cast<uint4*>(v_s + key * Smem::kQkvLd + chunk * 8) = vvec;
    }
    __syncthreads();
    if (tile * kKeyTile > warp_last_pos) continue;  // every key of this tile is after this warp's rows

    {  // S = Q_w · K^T: 16 x 64 scores in four 16x16 tiles; each Q fragment serves all four.
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag[kKeyTile / 16];
#pragma unroll
      for (int n = 0; n < kKeyTile / 16; ++n) wmma::fill_fragment(s_frag[n], 0.0f);
#pragma unroll 4
      for (int kk = 0; kk < HD / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, q_s + warp * 16 * Smem::kQkvLd + kk * 16, Smem::kQkvLd);
#pragma unroll
        for (int n = 0; n < kKeyTile / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
          wmma::load_matrix_sync(b, k_s + n * 16 * Smem::kQkvLd + kk * 16, Smem::kQkvLd);
          wmma::mma_sync(s_frag[n], a, b, s_frag[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kKeyTile / 16; ++n)
        wmma::store_matrix_sync(s_w + n * 16, s_frag[n], Smem::kSLd, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this lane's 32 columns of its row; the two halves combine by shuffle.
    float tile_max = -FLT_MAX;
    const int col0 = my_half * 32;
    for (int c = 0; c < 32; ++c) {
      const int key_pos = tile * kKeyTile + col0 + c;
      if (row_valid && key_pos <= my_pos) tile_max = fmaxf(tile_max, s_w[my_row * Smem::kSLd + col0 + c] * p.scale);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    // A row with no visible key keeps tile_max = -FLT_MAX and never asks for a rescale.
    const bool grow = tile_max > row_max + kRescaleThreshold || (row_max == -FLT_MAX && tile_max > -FLT_MAX);
    if (__any_sync(0xffffffffu, grow)) {  // rare after the first tile: rescale O through shared memory
      const float new_max = grow ? tile_max : row_max;
      const float alpha = grow ? expf(row_max - new_max) : 1.0f;
      row_sum *= alpha;
      row_max = new_max;
      if (my_half == 0) alpha_w[my_row] = alpha;
#pragma unroll
      for (int dn = 0; dn < kDn; ++dn) wmma::store_matrix_sync(o_w + dn * 16, o_frag[dn], Smem::kOLd, wmma::mem_row_major);
      __syncwarp();
      for (int idx = lane; idx < 16 * HD; idx += 32) o_w[(idx / HD) * Smem::kOLd + idx % HD] *= alpha_w[idx / HD];
      __syncwarp();
#pragma unroll
      for (int dn = 0; dn < kDn; ++dn) wmma::load_matrix_sync(o_frag[dn], o_w + dn * 16, Smem::kOLd, wmma::mem_row_major);
    }
    float tile_sum = 0.0f;
    for (int c = 0; c < 32; ++c) {
      const int key_pos = tile * kKeyTile + col0 + c;
      float prob = 0.0f;
      if (row_valid && key_pos <= my_pos) prob = expf(s_w[my_row * Smem::kSLd + col0 + c] * p.scale - row_max);
      const __nv_bfloat16 rounded = __float2bfloat16_rn(prob);
      p_w[my_row * Smem::kPLd + col0 + c] = rounded;
      tile_sum += __bfloat162float(rounded);  // the sum matches the weights P·V uses
    }
    tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
    row_sum += tile_sum;
    __syncwarp();

    // O += P · V; each P fragment serves every output column block.
#pragma unroll
    for (int ks = 0; ks < kKeyTile / 16; ++ks) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
      wmma::load_matrix_sync(a, p_w + ks * 16, Smem::kPLd);
#pragma unroll
      for (int dn = 0; dn < kDn; ++dn) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(b, v_s + ks * 16 * Smem::kQkvLd + dn * 16, Smem::kQkvLd);
        wmma::mma_sync(o_frag[dn], a, b, o_frag[dn]);
      }
    }
    __syncwarp();
  }

#pragma unroll
  for (int dn = 0; dn < kDn; ++dn) wmma::store_matrix_sync(o_w + dn * 16, o_frag[dn], Smem::kOLd, wmma::mem_row_major);
  if (my_half == 0) l_w[my_row] = row_sum;
  __syncwarp();
  for (int idx = lane; idx < 16 * HD; idx += 32) {
    const int r = idx / HD, d = idx % HD;
    if (warp * 16 + r < item.num_rows)
      p.out[(static_cast<int64_t>(item.row + warp * 16 + r) * p.num_heads + head) * HD + d] =
          o_w[r * Smem::kOLd + d] / l_w[r];
  }
}

}  // namespace ninfer::cuda::kernels
