// Causal prefill attention over the paged cache on tensor cores (FlashAttention-2 style).
//
// A block takes one plan item (kPrefillBlockRows = 64 consecutive query rows of one slice) for
// kHeads query heads that share a KV head, so each K/V page it loads serves all of them: 4
// warps per head, 16 query rows per warp. Keys are walked one 64-token page at a time:
//   S = Q·K^T      mma.sync m16n8k16 (bf16 in, f32 out), S stays in registers;
//   online softmax on the accumulator fragments (exp2 with the scale folded into log2 e);
//   O += P·V       P rounded to bf16 in registers: two adjacent C fragments of S are exactly
//                  one A fragment of P, so scores never go through shared memory.
// K/V pages arrive by cp.async, either single-buffered in FlashAttention-2 order (kStages = 1:
// V of this page loads during Q·K^T, K of the next page during softmax and P·V) or double-
// buffered (kStages = 2: the whole next page loads during this page's work). Shared tiles are
// XOR-swizzled in 16-byte chunks so that ldmatrix and cp.async hit distinct banks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/attention_plan.h"
#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_decode_attention.cuh"
#include "backends/cuda/kernels_mma.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kKeyTile = 64;  // one KV page
inline constexpr int kWarpsPerHead = kPrefillBlockRows / 16;

struct PrefillParams {
  KvLayout kv;
  const int32_t* pages;
  const PrefillItem* items;
  const float* q;
  float* out;
  int num_heads;
  int group;    // query heads per KV head
  float scale;  // of the scores, before the softmax
};

template <int HD, int kHeads, int kStages>
struct PrefillConfig {
  static_assert(HD % 64 == 0, "the swizzle needs at least 8 chunks of 16 bytes per row");
  static constexpr int kQRows = kPrefillBlockRows * kHeads;
  static constexpr int kChunks = HD / 8;  // 16-byte chunks of a bf16 row
  static constexpr uint32_t kRowBytes = HD * 2;
  static constexpr uint32_t kTileBytes = kKeyTile * kRowBytes;
  static constexpr uint32_t kQBytes = kQRows * kRowBytes;
  static constexpr uint32_t kSmemBytes = kQBytes + 2 * kStages * kTileBytes;  // Q, then K and V per stage
  // Resident warps an SM should hold (the register cap follows): 8 for head_dim 256 still
  // leaves 255 registers a thread (the O accumulator alone takes 128); smaller ones fit 12.
  static constexpr int kWarps = kWarpsPerHead * kHeads;
  static constexpr int kTargetWarps = HD == 256 ? 8 : 12;
  static constexpr int kMinBlocks = kTargetWarps / kWarps > 1 ? kTargetWarps / kWarps : 1;
  static constexpr int kThreads = kWarps * 32;
};

// Shared-memory layouts of bf16 tiles: the byte offset of 16-byte chunk `chunk` of row `row`.
// Rows of HD elements, chunks XOR-ed with row % 8 so that ldmatrix reads hit distinct banks.
template <int HD>
struct RowSwizzle {
  static __device__ __forceinline__ uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>(row * HD * 2 + ((chunk ^ (row & 7)) << 4));
  }
};
// wgmma's 128-byte swizzle, in tiles of 64 rows (rows 64.. start the next tile): 64-element
// column groups of 64 rows x 128 bytes, chunks XOR-ed with row % 8 (1024-byte aligned).
template <int HD>
struct WgmmaSwizzle {
  static constexpr uint32_t kGroupBytes = 64 * 128, kTileBytes = 64 * HD * 2;
  static __device__ __forceinline__ uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((row >> 6) * kTileBytes + (chunk >> 3) * kGroupBytes + (row & 63) * 128 +
                                 (((chunk & 7) ^ (row & 7)) << 4));
  }
};

// Copies key rows [0, 64) of one page's K (which = 0) or V (1) for `kv_head` into a tile;
// keys after `last_key` were never written (they could hold NaN) and are zero-filled.
template <int HD, int kThreads, class Layout>
__device__ __forceinline__ void load_kv_tile(const PrefillParams& p, int32_t page, int which, int kv_head,
                                             int last_key, uint32_t dst) {
  // A pass of the block covers kKeysPerPass whole rows; a thread keeps its chunk in every pass.
  constexpr int kChunks = HD / 8, kKeysPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kKeyTile % kKeysPerPass == 0);
  const int first_key = static_cast<int>(threadIdx.x) / kChunks, chunk = static_cast<int>(threadIdx.x) % kChunks;
  const int key_stride = p.kv.num_kv_heads * HD;
  const uint16_t* src = kv_row(p.kv, page, which, 0, HD) + kv_head * HD + first_key * key_stride + chunk * 8;
#pragma unroll
  for (int i = 0; i < kKeyTile / kKeysPerPass; ++i) {
    const int key = first_key + i * kKeysPerPass;
    cp_async_16(dst + Layout::offset(key, chunk), src + i * kKeysPerPass * key_stride, key <= last_key);
  }
}

// The block's Q rows (kHeads heads x 64 rows, f32 in global memory) as a bf16 tile; rows past
// the item's end are zero.
template <int HD, int kHeads, int kThreads, class Layout>
__device__ __forceinline__ void load_q_tile(const PrefillParams& p, const PrefillItem& item, int first_head,
                                            unsigned char* dst) {
  constexpr int kChunks = HD / 8;
  constexpr int kPerThread = kPrefillBlockRows * kHeads * kChunks / kThreads;
#pragma unroll 4
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int q_row = idx / kChunks, chunk = idx % kChunks;
    const int slot = q_row / kPrefillBlockRows, r = q_row % kPrefillBlockRows;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < item.num_rows) {
      const auto* src = reinterpret_cast<const float4*>(
          p.q + (static_cast<int64_t>(item.row + r) * p.num_heads + first_head + slot) * HD + chunk * 8);
      const float4 lo = __ldg(src), hi = __ldg(src + 1);
      packed = make_uint4(pack_bf16x2(lo.x, lo.y), pack_bf16x2(lo.z, lo.w), pack_bf16x2(hi.x, hi.y),
                          pack_bf16x2(hi.z, hi.w));
    }
    *reinterpret_cast<uint4*>(dst + Layout::offset(q_row, chunk)) = packed;
  }
}

// s = Q_w · K^T for the warp's 16 rows and the 64 keys of the tile (8 C fragments of 8 keys).
// q_addr/k_addr: the lane's ldmatrix addresses for head-dim steps kk % 4 (see the kernel).
template <int HD>
__device__ __forceinline__ void warp_scores(float (&s)[kKeyTile / 8][4], const uint32_t (&q_addr)[4],
                                            const uint32_t (&k_addr)[4], uint32_t stage_offset) {
#pragma unroll
  for (int n = 0; n < kKeyTile / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  // Steps run over (head-dim step kk, key block nb); the K fragments of the next step load while
  // this one multiplies, Q's of the next kk while its last key block does.
  constexpr int kKeyBlocks = kKeyTile / 16, kSteps = HD / 16 * kKeyBlocks;
  uint32_t a[2][4], b[2][4];
  auto load_b = [&](int i) {
    const int kk = i / kKeyBlocks, nb = i % kKeyBlocks;
    ldmatrix_x4(b[i & 1], k_addr[kk & 3] + stage_offset + (kk >> 2) * 128 + nb * 16 * HD * 2);
  };
  auto load_a = [&](int kk) { ldmatrix_x4(a[kk & 1], q_addr[kk & 3] + (kk >> 2) * 128); };
  load_a(0);
  load_b(0);
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    const int kk = i / kKeyBlocks, nb = i % kKeyBlocks;
    if (i + 1 < kSteps) load_b(i + 1);
    if (nb == kKeyBlocks - 1 && kk + 1 < HD / 16) load_a(kk + 1);
    mma_bf16_16816(s[2 * nb], a[kk & 1], b[i & 1][0], b[i & 1][1]);
    mma_bf16_16816(s[2 * nb + 1], a[kk & 1], b[i & 1][2], b[i & 1][3]);
  }
}

// o += P · V for the warp's 16 rows; p: P as A fragments of 16 keys each.
template <int HD>
__device__ __forceinline__ void warp_accumulate_pv(float (&o)[HD / 8][4], const uint32_t (&p)[kKeyTile / 16][4],
                                                   const uint32_t (&v_addr)[4], uint32_t stage_offset) {
  constexpr int kDSteps = HD / 16, kSteps = kKeyTile / 16 * kDSteps;
  uint32_t b[2][4];
  auto load = [&](int i, int buf) {
    const int kb = i / kDSteps, dp = i % kDSteps;
    ldmatrix_x4_trans(b[buf], v_addr[dp & 3] + stage_offset + (dp >> 2) * 128 + kb * 16 * HD * 2);
  };
  load(0, 0);
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    if (i + 1 < kSteps) load(i + 1, (i + 1) & 1);
    const int kb = i / kDSteps, dp = i % kDSteps;
    mma_bf16_16816(o[2 * dp], p[kb], b[i & 1][0], b[i & 1][1]);
    mma_bf16_16816(o[2 * dp + 1], p[kb], b[i & 1][2], b[i & 1][3]);
  }
}

// Hides the keys after each row in a diagonal tile: s holds a warp's 16 rows (positions
// first_row_pos + r) against keys tile_pos .. tile_pos + 63, as C fragments.
__device__ __forceinline__ void mask_future_keys(float (&s)[kKeyTile / 8][4], int tile_pos, int first_row_pos,
                                                 int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < kKeyTile / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key_pos = tile_pos + n * 8 + 2 * t + (e & 1);
      if (key_pos > first_row_pos + g + 8 * (e >> 1)) s[n][e] = -INFINITY;
    }
}

// Online-softmax state of the two rows a lane holds (g and g + 8 of its warp's 16): the
// running max in log2 units (scale applied) and the lane's share of the running sum (its 2 of
// every 8 columns; the quad's shares are added up by inverse_sum).
struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  // Takes a tile of scores: rescales o when a row's max grew and turns s into the tile's
  // probabilities, returned as bf16 A fragments of 16 keys each.
  template <int HD>
  __device__ __forceinline__ void consume(float (&s)[kKeyTile / 8][4], float (&o)[HD / 8][4],
                                          uint32_t (&p)[kKeyTile / 16][4], float scale_log2) {
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeyTile / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[h], tile_max * scale_log2);
      // Every row sees key 0 on its first tile, so new_max is finite from then on; the guard
      // keeps a row with no visible key yet from producing NaN.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      alpha[h] = exp2_approx(row_max[h] - base);
      row_max[h] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kKeyTile / 8; ++n) {
        s[n][2 * h] = exp2_approx(fmaf(s[n][2 * h], scale_log2, -base));
        s[n][2 * h + 1] = exp2_approx(fmaf(s[n][2 * h + 1], scale_log2, -base));
        sum += s[n][2 * h] + s[n][2 * h + 1];
      }
      row_sum[h] = row_sum[h] * alpha[h] + sum;
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int kb = 0; kb < kKeyTile / 16; ++kb) {
      p[kb][0] = pack_bf16x2(s[2 * kb][0], s[2 * kb][1]);
      p[kb][1] = pack_bf16x2(s[2 * kb][2], s[2 * kb][3]);
      p[kb][2] = pack_bf16x2(s[2 * kb + 1][0], s[2 * kb + 1][1]);
      p[kb][3] = pack_bf16x2(s[2 * kb + 1][2], s[2 * kb + 1][3]);
    }
  }

  __device__ __forceinline__ float inverse_sum(int h) const {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    return 1.0f / sum;
  }
};

// Writes a warp's 16 rows of O / row sum (rows first_row .. of the item that exist).
template <int HD>
__device__ __forceinline__ void store_warp_rows(const PrefillParams& p, const PrefillItem& item, int head,
                                               int first_row, const float (&o)[HD / 8][4],
                                               const OnlineSoftmax& softmax, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = softmax.inverse_sum(h);
    const int r = first_row + g + 8 * h;
    if (r >= item.num_rows) continue;
    float* dst = p.out + (static_cast<int64_t>(item.row + r) * p.num_heads + head) * HD + 2 * t;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
}

// grid: (num_heads / kHeads, items); items come longest first, so with heads varying fastest
// the longest rows of every head start first.
template <int HD, int kHeads, int kStages>
__global__ void __launch_bounds__(PrefillConfig<HD, kHeads, kStages>::kThreads,
                                  PrefillConfig<HD, kHeads, kStages>::kMinBlocks)
    prefill_attention(const PrefillParams p) {
  using Cfg = PrefillConfig<HD, kHeads, kStages>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_tile = shared_address(smem);
  const uint32_t kv_tiles = q_tile + Cfg::kQBytes;  // stage s: K at 2s tiles, V at 2s + 1
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int head_slot = warp / kWarpsPerHead;
  const int warp_row0 = (warp % kWarpsPerHead) * 16;  // the warp's first row within the item

  const PrefillItem item = p.items[blockIdx.y];
  const int first_head = static_cast<int>(blockIdx.x) * kHeads;
  const int head = first_head + head_slot;
  const int kv_head = first_head / p.group;
  const int last_pos = item.first_pos + item.num_rows - 1;  // the block sees keys [0, last_pos]
  const int num_tiles = last_pos / kKeyTile + 1;
  const int warp_first_pos = item.first_pos + warp_row0;
  const bool warp_has_rows = warp_row0 < item.num_rows;
  const int warp_last_pos = min(warp_first_pos + 15, last_pos);

  // ldmatrix addresses. Lane l addresses row l % 8 of matrix l / 8. Q (A operand) and V (B
  // operand, transposed) take matrices {rows 0-7, 8-15} x {columns 0-7, 8-15}; K (B operand)
  // takes {columns 0-7, 8-15} x {keys 0-7, 8-15}. Every row offset is a multiple of 8 plus
  // lane % 8, so the lane's swizzle term is lane % 8, and head-dim steps kk and kk + 4 differ
  // by 8 chunks (128 bytes): four addresses per operand cover all steps.
  const int lane_row = lane & 7;
  const int low_high = (lane >> 3) & 1, left_right = lane >> 4;
  uint32_t q_addr[4], k_addr[4], v_addr[4];  // stage 0; stage s is 2 s tiles further
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t qv_chunk = ((2 * j + left_right) ^ lane_row) << 4;
    const uint32_t k_chunk = ((2 * j + low_high) ^ lane_row) << 4;
    q_addr[j] = q_tile + (head_slot * kPrefillBlockRows + warp_row0 + lane_row + 8 * low_high) * Cfg::kRowBytes +
                qv_chunk;
    k_addr[j] = kv_tiles + (lane_row + 8 * left_right) * Cfg::kRowBytes + k_chunk;
    v_addr[j] = kv_tiles + Cfg::kTileBytes + (lane_row + 8 * low_high) * Cfg::kRowBytes + qv_chunk;
  }

  auto load_kv = [&](int tile, int which, int stage) {
    const int32_t page = p.pages[item.pages_offset + tile];
    load_kv_tile<HD, Cfg::kThreads, RowSwizzle<HD>>(p, page, which, kv_head, last_pos - tile * kKeyTile,
                                    kv_tiles + (2 * stage + which) * Cfg::kTileBytes);
  };
  load_kv(0, 0, 0);
  if constexpr (kStages == 2) load_kv(0, 1, 0);
  cp_async_commit();
  load_q_tile<HD, kHeads, Cfg::kThreads, RowSwizzle<HD>>(p, item, first_head, smem);

  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.scale * kLog2e;
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  OnlineSoftmax softmax;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = kStages == 2 ? (tile & 1) : 0;
    const uint32_t stage_offset = 2 * stage * Cfg::kTileBytes;
    cp_async_wait<0>();
    __syncthreads();  // this tile's K (and V) landed; every warp is done with the buffers reloaded next
    if constexpr (kStages == 2) {
      if (tile + 1 < num_tiles) {
        load_kv(tile + 1, 0, stage ^ 1);
        load_kv(tile + 1, 1, stage ^ 1);
      }
    } else {
      load_kv(tile, 1, 0);
    }
    cp_async_commit();

    const int tile_pos = tile * kKeyTile;
    const bool active = warp_has_rows && tile_pos <= warp_last_pos;  // else every key is after its rows
    float s[kKeyTile / 8][4];
    if (active) warp_scores<HD>(s, q_addr, k_addr, stage_offset);
    if constexpr (kStages == 1) {
      cp_async_wait<0>();
      __syncthreads();  // V landed; every warp is done with K
      if (tile + 1 < num_tiles) load_kv(tile + 1, 0, 0);
      cp_async_commit();
    }
    if (!active) continue;

    if (tile_pos + kKeyTile - 1 > warp_first_pos) mask_future_keys(s, tile_pos, warp_first_pos, lane);
    uint32_t p_frag[kKeyTile / 16][4];
    softmax.consume<HD>(s, o, p_frag, scale_log2);
    warp_accumulate_pv<HD>(o, p_frag, v_addr, stage_offset);
  }
  cp_async_wait<0>();  // nothing may be in flight when the block exits

  if (warp_has_rows) store_warp_rows<HD>(p, item, head, warp_row0, o, softmax, lane);
}

}  // namespace ninfer::cuda::kernels
