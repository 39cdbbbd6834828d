// Causal prefill attention with warpgroup MMA (sm_90a wgmma): the kernel of
// kernels_prefill_attention.cuh with both products issued by the whole warpgroup, so each K/V
// element is read from shared memory once per 64 query rows instead of once per warp's 16.
//
// A block is one warpgroup (4 warps) on one plan item (64 query rows) of one query head:
//   S = Q·K^T   16 x wgmma m64n64k16, Q and K from shared memory (K-major);
//   softmax     on the accumulator fragments, as the mma.sync kernel (OnlineSoftmax);
//   O += P·V    4 x wgmma m64n{HD}k16, P from registers, V from shared memory (N-major).
// Tiles use wgmma's 128-byte swizzled layout (WgmmaSwizzle). K/V pages are single-buffered
// in FlashAttention-2 order: V of this page loads during Q·K^T, K of the next page during
// softmax and P·V. The products are collective, so a warp whose rows see none of a diagonal
// tile's keys still takes part (its probabilities are all zero).
#pragma once

#include "backends/cuda/kernels_prefill_attention.cuh"
#include "backends/cuda/kernels_wgmma.cuh"

namespace ninfer::cuda::kernels {

template <int HD>
struct WgmmaPrefillConfig {
  static constexpr int kThreads = 128;
  static constexpr uint32_t kTileBytes = kPrefillBlockRows * HD * 2;  // Q, K and V tiles alike
  static constexpr uint32_t kSmemBytes = 3 * kTileBytes + 1024;       // + room to align to 1024
  static constexpr int kMinBlocks = HD == 256 ? 2 : 3;
  static_assert(kPrefillBlockRows == kKeyTile, "Q, K and V tiles share one layout");
};

// O += P · V for the warpgroup's 64 rows; p: this lane's P fragments of 16 keys each.
template <int HD>
__device__ __forceinline__ void warpgroup_accumulate_pv(float (&o)[HD / 8][4], const uint32_t (&p)[kKeyTile / 16][4],
                                                        uint32_t v_tile) {
  constexpr uint32_t kGroupBytes = kKeyTile * 128;  // one 64-column group of the V tile
#pragma unroll
  for (int kb = 0; kb < kKeyTile / 16; ++kb) {
    const uint64_t b = wgmma_descriptor(v_tile + kb * 16 * 128, kGroupBytes, 1024);
    if constexpr (HD == 256)
      wgmma_m64n256k16_rs(o, p[kb], b);
    else if constexpr (HD == 128)
      wgmma_m64n128k16_rs(o, p[kb], b);
    else
      wgmma_m64n64k16_rs(o, p[kb], b);
  }
}

// grid: (num_heads, items), items longest first.
template <int HD>
__global__ void __launch_bounds__(WgmmaPrefillConfig<HD>::kThreads, WgmmaPrefillConfig<HD>::kMinBlocks)
    prefill_attention_wgmma(const PrefillParams p) {
  using Cfg = WgmmaPrefillConfig<HD>;
  using Layout = WgmmaSwizzle<kPrefillBlockRows>;
  extern __shared__ __align__(128) unsigned char smem[];  // aligned to 1024 below
  const uint32_t smem_base = shared_address(smem);
  const uint32_t aligned = (smem_base + 1023) & ~1023u;
  const uint32_t q_tile = aligned, k_tile = aligned + Cfg::kTileBytes, v_tile = aligned + 2 * Cfg::kTileBytes;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int warp_row0 = warp * 16;

  const PrefillItem item = p.items[blockIdx.y];
  const int head = static_cast<int>(blockIdx.x);
  const int kv_head = head / p.group;
  const int last_pos = item.first_pos + item.num_rows - 1;
  const int num_tiles = last_pos / kKeyTile + 1;
  const int warp_first_pos = item.first_pos + warp_row0;

  auto load_kv = [&](int tile, int which) {
    const int32_t page = p.pages[item.pages_offset + tile];
    load_kv_tile<HD, Cfg::kThreads, Layout>(p, page, which, kv_head, last_pos - tile * kKeyTile,
                                            which == 0 ? k_tile : v_tile);
  };
  load_kv(0, 0);
  cp_async_commit();
  load_q_tile<HD, 1, Cfg::kThreads, Layout>(p, item, head, smem + (aligned - smem_base));

  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.scale * kLog2e;
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  OnlineSoftmax softmax;
  constexpr uint32_t kGroupBytes = kPrefillBlockRows * 128;  // one 64-column group of a tile

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<0>();
    fence_proxy_async();  // the copies (and Q's stores) are read by wgmma, another proxy
    __syncthreads();      // K landed everywhere; the previous P·V is done with V
    load_kv(tile, 1);
    cp_async_commit();

    float s[kKeyTile / 8][4] = {};  // the first product overwrites it
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const uint32_t step = (kk >> 2) * kGroupBytes + (kk & 3) * 32;
      wgmma_m64n64k16_ss(s, wgmma_descriptor(q_tile + step, 16, 1024), wgmma_descriptor(k_tile + step, 16, 1024),
                         kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_registers(s);

    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // V landed everywhere; every warp's Q·K^T is done with K
    if (tile + 1 < num_tiles) load_kv(tile + 1, 0);
    cp_async_commit();

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
