// Causal prefill attention over the paged cache with warpgroup MMA (sm_90a wgmma), in the
// FlashAttention-2 manner.
//
// A block is one warpgroup (4 warps, 16 query rows each) on one plan item (kPrefillBlockRows =
// 64 consecutive query rows of one slice) of one query head. Keys are walked one 64-token page
// at a time:
//   S = Q·K^T   16 x wgmma m64n64k16, Q and K from shared memory (K-major); S stays in
//               registers;
//   softmax     online, on the accumulator fragments (exp2 with the scale folded into log2 e);
//   O += P·V    4 x wgmma m64n{HD}k16, V from shared memory (N-major), P rounded to bf16 in
//               registers: two adjacent C fragments of S are exactly one A fragment of P, so
//               scores never go through shared memory.
// Each K/V element is read from shared memory once per 64 query rows (the products are the
// warpgroup's), not once per warp as with mma.sync. Tiles use wgmma's 128-byte swizzled layout
// (TileLayout); K/V pages arrive by cp.async, single-buffered in FlashAttention-2 order
// (kStages = 1: V of this page loads during Q·K^T, K of the next page during softmax and P·V)
// or double-buffered (kStages = 2: the whole next page loads during this page's work). The
// products are collective, so a warp whose rows see none of a diagonal tile's keys still takes
// part (its probabilities are all zero).
//
// A quantized pool (F != kKvBf16) cannot be copied as it is: each thread loads its chunks'
// codes and scales (a batch of passes at once, so several loads are in flight), dequantizes
// them to bf16 and stores them into the same swizzled tile; the later cp.async waits are then
// empty and the fences and barriers order the stores as they order the copies.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/attention_plan.h"
#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_decode_attention.cuh"
#include "backends/cuda/kernels_wgmma.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kKeyTile = 64;  // one KV page
static_assert(kPrefillBlockRows == 64 && kKeyTile == 64, "Q, K and V tiles share one layout");

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

// A 64-row bf16 tile (Q, K or V) in wgmma's 128-byte swizzled layout: 64-element column groups
// of 64 rows x 128 bytes, 16-byte chunks XOR-ed with row % 8 (1024-byte aligned).
template <int HD>
struct TileLayout {
  static constexpr uint32_t kGroupBytes = 64 * 128, kTileBytes = 64 * HD * 2;
  // Byte offset of 16-byte chunk `chunk` of row `row`.
  static __device__ __forceinline__ uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((chunk >> 3) * kGroupBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
  }
};

template <int HD, int kStages>
struct PrefillConfig {
  static constexpr int kThreads = 128;
  static constexpr uint32_t kTileBytes = TileLayout<HD>::kTileBytes;
  static constexpr uint32_t kSmemBytes = (1 + 2 * kStages) * kTileBytes + 1024;  // + room to align
  // Blocks an SM should hold (the register cap follows): two for head_dim 256 still leave 255
  // registers a thread (the O accumulator alone takes 128); smaller head dims fit three.
  static constexpr int kMinBlocks = HD == 256 ? 2 : 3;
};

__device__ __forceinline__ void store_shared_16(uint32_t address, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Copies key rows [0, 64) of one page's K (which = 0) or V (1) for `kv_head` into a tile;
// keys after `last_key` were never written (they could hold NaN) and are zero-filled.
template <int HD, int kThreads, int F = kKvBf16>
__device__ __forceinline__ void load_kv_tile(const PrefillParams& p, int32_t page, int which, int kv_head,
                                             int last_key, uint32_t dst) {
  // A pass of the block covers kKeysPerPass whole rows; a thread keeps its chunk in every pass.
  constexpr int kChunks = HD / 8, kKeysPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kKeyTile % kKeysPerPass == 0);
  const int first_key = static_cast<int>(threadIdx.x) / kChunks, chunk = static_cast<int>(threadIdx.x) % kChunks;
  if constexpr (F != kKvBf16) {
    using Read = KvRead<F>;
    // Batches of 4 passes (2 at head_dim 256, where the O accumulator leaves few registers).
    constexpr int kPasses = kKeyTile / kKeysPerPass, kBatch = HD == 256 ? 2 : (kPasses < 4 ? kPasses : 4);
#pragma unroll
    for (int i0 = 0; i0 < kPasses; i0 += kBatch) {
      typename Read::Raw raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int key = first_key + (i0 + b) * kKeysPerPass;
        raw[b] = key <= last_key ? Read::template load<HD>(p.kv, page, which, key, kv_head, chunk) : Read::zero();
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int key = first_key + (i0 + b) * kKeysPerPass;
        float f[8];
        Read::to_float(raw[b], f);
        const uint4 packed = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                                        pack_bf16x2(f[6], f[7]));
        store_shared_16(dst + TileLayout<HD>::offset(key, chunk), packed);
      }
    }
    return;
  }
  const int key_stride = p.kv.num_kv_heads * HD;
  const uint16_t* src = kv_row(p.kv, page, which, 0, HD) + kv_head * HD + first_key * key_stride + chunk * 8;
#pragma unroll
  for (int i = 0; i < kKeyTile / kKeysPerPass; ++i) {
    const int key = first_key + i * kKeysPerPass;
    cp_async_16(dst + TileLayout<HD>::offset(key, chunk), src + i * kKeysPerPass * key_stride, key <= last_key);
  }
}

// The item's 64 query rows of `head` (f32 in global memory) as a bf16 tile; rows past the
// item's end are zero.
template <int HD, int kThreads>
__device__ __forceinline__ void load_q_tile(const PrefillParams& p, const PrefillItem& item, int head,
                                            unsigned char* dst) {
  constexpr int kChunks = HD / 8;
#pragma unroll 4
  for (int i = 0; i < kPrefillBlockRows * kChunks / kThreads; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = idx / kChunks, chunk = idx % kChunks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < item.num_rows) {
      const auto* src =
          reinterpret_cast<const float4*>(p.q + (static_cast<int64_t>(item.row + r) * p.num_heads + head) * HD) +
          2 * chunk;
      const float4 lo = __ldg(src), hi = __ldg(src + 1);
      packed = make_uint4(pack_bf16x2(lo.x, lo.y), pack_bf16x2(lo.z, lo.w), pack_bf16x2(hi.x, hi.y),
                          pack_bf16x2(hi.z, hi.w));
    }
    *reinterpret_cast<uint4*>(dst + TileLayout<HD>::offset(r, chunk)) = packed;
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

// O += P · V for the warpgroup's 64 rows; p: this lane's P fragments of 16 keys each.
template <int HD>
__device__ __forceinline__ void warpgroup_accumulate_pv(float (&o)[HD / 8][4], const uint32_t (&p)[kKeyTile / 16][4],
                                                        uint32_t v_tile) {
#pragma unroll
  for (int kb = 0; kb < kKeyTile / 16; ++kb) {
    const uint64_t b = wgmma_descriptor(v_tile + kb * 16 * 128, TileLayout<HD>::kGroupBytes, 1024);
    if constexpr (HD == 256)
      wgmma_m64n256k16_rs(o, p[kb], b);
    else if constexpr (HD == 128)
      wgmma_m64n128k16_rs(o, p[kb], b);
    else
      wgmma_m64n64k16_rs(o, p[kb], b);
  }
}

// grid: (num_heads, items); items come longest first, so with heads varying fastest the
// longest rows of every head start first.
template <int HD, int kStages, int F = kKvBf16>
__global__ void __launch_bounds__(PrefillConfig<HD, kStages>::kThreads, PrefillConfig<HD, kStages>::kMinBlocks)
    prefill_attention(const PrefillParams p) {
  using Cfg = PrefillConfig<HD, kStages>;
  using Layout = TileLayout<HD>;
  extern __shared__ __align__(128) unsigned char smem[];  // aligned to 1024 below
  const uint32_t smem_base = shared_address(smem);
  const uint32_t q_tile = (smem_base + 1023) & ~1023u;
  const uint32_t kv_tiles = q_tile + Cfg::kTileBytes;  // stage s: K at 2s tiles, V at 2s + 1
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int warp_row0 = warp * 16;

  const PrefillItem item = p.items[blockIdx.y];
  const int head = static_cast<int>(blockIdx.x);
  const int kv_head = head / p.group;
  const int last_pos = item.first_pos + item.num_rows - 1;  // the block sees keys [0, last_pos]
  const int num_tiles = last_pos / kKeyTile + 1;
  const int warp_first_pos = item.first_pos + warp_row0;

  auto load_kv = [&](int tile, int which, int stage) {
    const int32_t page = p.pages[item.pages_offset + tile];
    load_kv_tile<HD, Cfg::kThreads, F>(p, page, which, kv_head, last_pos - tile * kKeyTile,
                                    kv_tiles + (2 * stage + which) * Cfg::kTileBytes);
  };
  load_kv(0, 0, 0);
  if constexpr (kStages == 2) load_kv(0, 1, 0);
  cp_async_commit();
  load_q_tile<HD, Cfg::kThreads>(p, item, head, smem + (q_tile - smem_base));

  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.scale * kLog2e;
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  OnlineSoftmax softmax;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = kStages == 2 ? (tile & 1) : 0;
    const uint32_t k_tile = kv_tiles + 2 * stage * Cfg::kTileBytes, v_tile = k_tile + Cfg::kTileBytes;
    cp_async_wait<0>();
    fence_proxy_async();  // the copies (and Q's stores) are read by wgmma, another proxy
    __syncthreads();      // this tile's K (and V) landed; every warp is done with the buffers reloaded next
    if constexpr (kStages == 2) {
      if (tile + 1 < num_tiles) {
        load_kv(tile + 1, 0, stage ^ 1);
        load_kv(tile + 1, 1, stage ^ 1);
      }
    } else {
      load_kv(tile, 1, 0);
    }
    cp_async_commit();

    float s[kKeyTile / 8][4] = {};  // the first product overwrites it
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const uint32_t step = (kk >> 2) * Layout::kGroupBytes + (kk & 3) * 32;
      wgmma_m64n64k16_ss(s, wgmma_descriptor(q_tile + step, 16, 1024), wgmma_descriptor(k_tile + step, 16, 1024),
                         kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_registers(s);

    if constexpr (kStages == 1) {
      cp_async_wait<0>();
      fence_proxy_async();
      __syncthreads();  // V landed everywhere; every warp's Q·K^T is done with K
      if (tile + 1 < num_tiles) load_kv(tile + 1, 0, 0);
      cp_async_commit();
    }

    const int tile_pos = tile * kKeyTile;
    if (tile_pos + kKeyTile - 1 > warp_first_pos) mask_future_keys(s, tile_pos, warp_first_pos, lane);
    uint32_t p_frag[kKeyTile / 16][4];
    softmax.consume<HD>(s, o, p_frag, scale_log2);
    wgmma_fence_registers(o);
    wgmma_fence();
    warpgroup_accumulate_pv<HD>(o, p_frag, v_tile);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_registers(o);
  }
  cp_async_wait<0>();  // nothing may be in flight when the block exits

  if (warp_row0 < item.num_rows) store_warp_rows<HD>(p, item, head, warp_row0, o, softmax, lane);
}

}  // namespace ninfer::cuda::kernels
