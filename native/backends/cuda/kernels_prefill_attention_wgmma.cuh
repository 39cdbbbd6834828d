// Causal prefill attention with warpgroup MMA (sm_90a wgmma): the kernel of
// kernels_prefill_attention.cuh with both products issued by a whole warpgroup, so each K/V
// element is read from shared memory once per 64 query rows instead of once per warp's 16.
//
// A block takes one plan item (64 query rows) for kHeads query heads of one KV head, one
// warpgroup (4 warps) per head, all sharing each loaded K/V page:
//   S = Q·K^T   16 x wgmma m64n64k16, Q and K from shared memory (K-major);
//   softmax     on the accumulator fragments, as the mma.sync kernel (OnlineSoftmax);
//   O += P·V    4 x wgmma m64n{HD}k16, P from registers, V from shared memory (N-major).
// Tiles use wgmma's 128-byte swizzled layout (WgmmaSwizzle). K/V pages are single-buffered in
// FlashAttention-2 order (kStages = 1) or double-buffered (kStages = 2), as in the mma.sync
// kernel. The products are collective, so a warp whose rows see none of a diagonal tile's
// keys still takes part (its probabilities are all zero).
#pragma once

#include "backends/cuda/kernels_prefill_attention.cuh"
#include "backends/cuda/kernels_wgmma.cuh"

namespace ninfer::cuda::kernels {

template <int HD, int kHeads, int kStages>
struct WgmmaPrefillConfig {
  static_assert(kPrefillBlockRows == 64 && kKeyTile == 64, "Q, K and V tiles share one layout");
  static constexpr int kThreads = 128 * kHeads;
  static constexpr uint32_t kTileBytes = WgmmaSwizzle<HD>::kTileBytes;  // Q (per head), K and V alike
  static constexpr uint32_t kSmemBytes = (kHeads + 2 * kStages) * kTileBytes + 1024;  // + room to align
  // Resident warps an SM should hold (the register cap follows), as PrefillConfig.
  static constexpr int kTargetWarps = HD == 256 ? 8 : 12;
  static constexpr int kMinBlocks = kTargetWarps / (4 * kHeads) > 1 ? kTargetWarps / (4 * kHeads) : 1;
};

// O += P · V for the warpgroup's 64 rows; p: this lane's P fragments of 16 keys each.
template <int HD>
__device__ __forceinline__ void warpgroup_accumulate_pv(float (&o)[HD / 8][4], const uint32_t (&p)[kKeyTile / 16][4],
                                                        uint32_t v_tile) {
#pragma unroll
  for (int kb = 0; kb < kKeyTile / 16; ++kb) {
    const uint64_t b = wgmma_descriptor(v_tile + kb * 16 * 128, WgmmaSwizzle<HD>::kGroupBytes, 1024);
    if constexpr (HD == 256)
      wgmma_m64n256k16_rs(o, p[kb], b);
    else if constexpr (HD == 128)
      wgmma_m64n128k16_rs(o, p[kb], b);
    else
      wgmma_m64n64k16_rs(o, p[kb], b);
  }
}

// grid: (num_heads / kHeads, items), items longest first.
template <int HD, int kHeads, int kStages>
__global__ void __launch_bounds__(WgmmaPrefillConfig<HD, kHeads, kStages>::kThreads,
                                  WgmmaPrefillConfig<HD, kHeads, kStages>::kMinBlocks)
    prefill_attention_wgmma(const PrefillParams p) {
  using Cfg = WgmmaPrefillConfig<HD, kHeads, kStages>;
  using Layout = WgmmaSwizzle<HD>;
  extern __shared__ __align__(128) unsigned char smem[];  // aligned to 1024 below
  const uint32_t smem_base = shared_address(smem);
  const uint32_t aligned = (smem_base + 1023) & ~1023u;
  const uint32_t kv_tiles = aligned + kHeads * Cfg::kTileBytes;  // stage s: K at 2s tiles, V at 2s + 1
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int head_slot = warp / 4;  // this warp's warpgroup
  const int warp_row0 = (warp % 4) * 16;
  const uint32_t q_tile = aligned + head_slot * Cfg::kTileBytes;

  const PrefillItem item = p.items[blockIdx.y];
  const int first_head = static_cast<int>(blockIdx.x) * kHeads;
  const int head = first_head + head_slot;
  const int kv_head = first_head / p.group;
  const int last_pos = item.first_pos + item.num_rows - 1;
  const int num_tiles = last_pos / kKeyTile + 1;
  const int warp_first_pos = item.first_pos + warp_row0;

  auto load_kv = [&](int tile, int which, int stage) {
    const int32_t page = p.pages[item.pages_offset + tile];
    load_kv_tile<HD, Cfg::kThreads, Layout>(p, page, which, kv_head, last_pos - tile * kKeyTile,
                                            kv_tiles + (2 * stage + which) * Cfg::kTileBytes);
  };
  load_kv(0, 0, 0);
  if constexpr (kStages == 2) load_kv(0, 1, 0);
  cp_async_commit();
  load_q_tile<HD, kHeads, Cfg::kThreads, Layout>(p, item, first_head, smem + (aligned - smem_base));

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
      __syncthreads();  // V landed everywhere; every warpgroup's Q·K^T is done with K
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
