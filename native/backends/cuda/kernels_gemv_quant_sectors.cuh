// Decode GEMVs over FP8 (W8A16) and NVFP4 (W4A16) weights, m <= 16, shaped for the read rate:
// y[m, n] = x[m, k] · W[n, k]^T on bf16 tensor cores, like kernels_gemv_quant.cuh, with two
// differences that the H200 probe (tools/gpu/probes/quant_gemv_probe.cu, bench/RESULTS.md
// 2026-12-02) found to matter:
// - Whole sectors per load instruction. A quad of lanes reads 64 contiguous bytes of a row
//   per instruction (lane t: bytes 16t and, FP8, 64 + 16t of each 128-k unit). The general
//   kernel's lane reads 32 consecutive bytes in two loads, so each instruction used half of
//   every 32-byte sector it fetched and the same sectors were requested twice.
// - Dequantization by bit placement (integer ops and one bf16x2 multiply), no conversion
//   instructions, which run on sm_90's quarter-rate pipe:
//   FP8 e4m3 (s eeee mmm) → bf16 bits 15 and 10..4 is the value · 2^-120 (e4m3 subnormals
//   are bf16 subnormals there), exact after one multiply by 2^120. Bytes 0, 2 of a word form
//   one bf16x2, bytes 1, 3 the other; x is paired the same way.
//   NVFP4 e2m1 (s ee m) → bf16 bits 15 and 8..6 is the value · 2^-126; one multiply by the
//   e4m3 group scale · 2^119 gives code · scale · 2^-7 (at most 6 significant bits: exact);
//   the 2^7 returns with the per-row scale. Codes j and j + 4 of a word form one bf16x2.
// x is rounded to bf16 (every matmul path's input rounding); products accumulate in f32; FP8
// block scales multiply each 128-k unit's partial sums in f32. Tiles of 8·kRowTiles rows, one
// block each; warps take interleaved units and add their partial sums in warp order through
// shared memory: deterministic, and the same result for every tile shape.
#pragma once

#include "backends/cuda/kernels_gemv_quant.cuh"

namespace ninfer::cuda::kernels {

// 4 e4m3 codes → {bf16x2 of codes 0, 2; bf16x2 of codes 1, 3}, exact.
__device__ __forceinline__ void e4m3x4_to_bf16_by_bits(uint32_t q, uint32_t& even, uint32_t& odd) {
  constexpr uint32_t kTwoPow120 = 0x7B807B80u;  // bf16 2^120 in both halves
  even = bf16x2_mul(((q << 8) & 0x80008000u) | ((q << 4) & 0x07F007F0u), kTwoPow120);
  odd = bf16x2_mul((q & 0x80008000u) | ((q >> 4) & 0x07F007F0u), kTwoPow120);
}

// 8 e2m1 codes (code j in nibble j) times a group scale · 2^119 (bf16x2 splat) → bf16x2 of
// codes (0, 4), (1, 5), (2, 6), (3, 7): each code · scale · 2^-7, exact.
__device__ __forceinline__ void e2m1x8_to_bf16_by_bits(uint32_t w, uint32_t scale, uint32_t (&b)[4]) {
  b[0] = bf16x2_mul(((w << 6) & 0x01C001C0u) | ((w << 12) & 0x80008000u), scale);
  b[1] = bf16x2_mul(((w << 2) & 0x01C001C0u) | ((w << 8) & 0x80008000u), scale);
  b[2] = bf16x2_mul(((w >> 2) & 0x01C001C0u) | ((w << 4) & 0x80008000u), scale);
  b[3] = bf16x2_mul(((w >> 6) & 0x01C001C0u) | (w & 0x80008000u), scale);
}
inline constexpr float kSectorsNvfp4Unscale = 128.0f;  // the 2^-7 of e2m1x8_to_bf16_by_bits

// Two e4m3 group scales (low byte first) as bf16x2 splats of scale · 2^119 (exact: ≤ 2^127.8).
__device__ __forceinline__ void group_scales_bf16_2p119(uint16_t both, uint32_t& first, uint32_t& second) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(both), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  first = pack_bf16x2(f.x * 0x1p119f, f.x * 0x1p119f);
  second = pack_bf16x2(f.y * 0x1p119f, f.y * 0x1p119f);
}

// The compile-time shape: 8·kRowTiles-row tiles, kWarps warps, kUnroll units of 128 k per
// warp loaded before any is used. kDoubleBuffer: each warp issues its next batch's loads before
// it dequantizes the current batch (two register buffers), so its loads stay in flight while it
// computes; without it a warp alternates between waiting for a batch and computing it.
template <int kRowTiles_, int kWarps_, int kUnroll_, bool kDoubleBuffer_ = false>
struct SectorShape {
  static constexpr int kRowTiles = kRowTiles_, kWarps = kWarps_, kUnroll = kUnroll_;
  static constexpr bool kDoubleBuffer = kDoubleBuffer_;
  static constexpr int kTileRows = 8 * kRowTiles, kThreads = 32 * kWarps;
};

// Requires k % 128 == 0 and 16-byte aligned rows (the launcher checks).
template <bool kNvfp4, typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads)
    gemv_quant_sectors(const QuantGemvTable table, const float* __restrict__ x, int m, int k) {
  constexpr int kRowTiles = Shape::kRowTiles, kWarps = Shape::kWarps, kUnroll = Shape::kUnroll;
  constexpr int kLoads = kNvfp4 ? 1 : 2;  // 16-byte loads per row and unit
  constexpr int kStride = kWarps * kUnroll;  // units between a warp's batches
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, tig = lane & 3;
  int j = 0;
  while (static_cast<int>(blockIdx.x) >= table.first_tile[j + 1]) ++j;
  const QuantGemvJob& job = table.job[j];
  const int row0 = (static_cast<int>(blockIdx.x) - table.first_tile[j]) * Shape::kTileRows;
  const int units = k / 128;
  const int64_t row_stride = kNvfp4 ? k / 2 : k;

  // This lane's weight rows (rows past the end re-read the last row: valid memory, never
  // stored) and, FP8, the block-scale rows of its accumulators (rows 8t + 2·tig + {0, 1}).
  const uint8_t* w_lane[kRowTiles];
  const uint8_t* group_scale_row[kRowTiles] = {};
  const float* block_scale_row[kRowTiles][2] = {};
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) {
    const int row = min(row0 + 8 * t + group, job.rows - 1);
    w_lane[t] = job.codes + static_cast<int64_t>(row) * row_stride + 16 * tig;
    if constexpr (kNvfp4)
      group_scale_row[t] = static_cast<const uint8_t*>(job.scales) + static_cast<int64_t>(job.first_row + row) * (k / 16);
#pragma unroll
    for (int i = 0; i < 2 && !kNvfp4; ++i) {
      const int g = job.first_row + min(row0 + 8 * t + 2 * tig + i, job.rows - 1);
      const int row_blocks = (job.group_rows + 127) / 128;
      block_scale_row[t][i] = static_cast<const float*>(job.scales) +
                              static_cast<int64_t>((g / job.group_rows) * row_blocks + (g % job.group_rows) / 128) * units;
    }
  }
  const bool x_lo_live = group < m, x_hi_live = kWide && group + 8 < m;
  const float* x_lo = x + static_cast<int64_t>(min(group, m - 1)) * k;
  const float* x_hi = x + static_cast<int64_t>(min(group + 8, m - 1)) * k;

  float acc[kRowTiles][4];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

  using Batch = uint4[kUnroll][kRowTiles][kLoads];
  // Issues the loads of the batch that starts at unit `first` (units past the end re-read the
  // last one, unused).
  const auto load_batch = [&](Batch& raw, int first) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int unit = min(first + u * kWarps, units - 1);
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        const uint8_t* p = w_lane[t] + static_cast<int64_t>(unit) * (kNvfp4 ? 64 : 128);
        raw[u][t][0] = load_ahead16(p);
        if constexpr (!kNvfp4) raw[u][t][1] = load_ahead16(p + 64);
      }
    }
  };
  // Dequantizes the batch that starts at unit `first` and adds its products to acc.
  const auto use_batch = [&](const Batch& raw, int first) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int unit = first + u * kWarps;
      if (unit >= units) break;
      if constexpr (!kNvfp4) {
        float part[kRowTiles][4];
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) part[t][0] = part[t][1] = part[t][2] = part[t][3] = 0.0f;
#pragma unroll
        for (int wd = 0; wd < 8; ++wd) {  // word wd: k = unit·128 + (wd / 4)·64 + 16·tig + 4·(wd % 4) + {0..3}
          const int64_t kx = static_cast<int64_t>(unit) * 128 + (wd / 4) * 64 + 16 * tig + 4 * (wd & 3);
          uint32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          if (x_lo_live) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(x_lo + kx));
            a0 = pack_bf16x2(v.x, v.z), a2 = pack_bf16x2(v.y, v.w);
          }
          if (x_hi_live) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(x_hi + kx));
            a1 = pack_bf16x2(v.x, v.z), a3 = pack_bf16x2(v.y, v.w);
          }
#pragma unroll
          for (int t = 0; t < kRowTiles; ++t) {
            const uint4& r = raw[u][t][wd / 4];
            const uint32_t q = (wd & 3) == 0 ? r.x : (wd & 3) == 1 ? r.y : (wd & 3) == 2 ? r.z : r.w;
            uint32_t even, odd;
            e4m3x4_to_bf16_by_bits(q, even, odd);
            mma_m16n8k16_bf16(part[t], a0, a1, a2, a3, even, odd);
          }
        }
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          const float s0 = __ldg(block_scale_row[t][0] + unit), s1 = __ldg(block_scale_row[t][1] + unit);
          add_block_scaled(acc, part, t, s0, s1);
        }
      } else {
        uint32_t scale[kRowTiles][2];  // the two group scales of this lane's 32 k, per row tile
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          const uint16_t both = __ldg(reinterpret_cast<const unsigned short*>(group_scale_row[t] + unit * 8 + 2 * tig));
          group_scales_bf16_2p119(both, scale[t][0], scale[t][1]);
        }
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) {  // word wd: k = unit·128 + 32·tig + 8·wd + {0..7}
          const int64_t kx = static_cast<int64_t>(unit) * 128 + 32 * tig + 8 * wd;
          uint32_t lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
          if (x_lo_live) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(x_lo + kx));
            const float4 b = __ldg(reinterpret_cast<const float4*>(x_lo + kx + 4));
            lo[0] = pack_bf16x2(a.x, b.x), lo[1] = pack_bf16x2(a.y, b.y);
            lo[2] = pack_bf16x2(a.z, b.z), lo[3] = pack_bf16x2(a.w, b.w);
          }
          if (x_hi_live) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(x_hi + kx));
            const float4 b = __ldg(reinterpret_cast<const float4*>(x_hi + kx + 4));
            hi[0] = pack_bf16x2(a.x, b.x), hi[1] = pack_bf16x2(a.y, b.y);
            hi[2] = pack_bf16x2(a.z, b.z), hi[3] = pack_bf16x2(a.w, b.w);
          }
#pragma unroll
          for (int t = 0; t < kRowTiles; ++t) {
            const uint4& r = raw[u][t][0];
            const uint32_t q = wd == 0 ? r.x : wd == 1 ? r.y : wd == 2 ? r.z : r.w;
            uint32_t b[4];
            e2m1x8_to_bf16_by_bits(q, scale[t][wd / 2], b);
            mma_m16n8k16_bf16(acc[t], lo[0], hi[0], lo[1], hi[1], b[0], b[1]);
            mma_m16n8k16_bf16(acc[t], lo[2], hi[2], lo[3], hi[3], b[2], b[3]);
          }
        }
      }
    }
  };

  // The weights depend on no earlier kernel: the first batch streams in while the previous
  // kernel (launched with programmatic serialization) may still run; x only after it.
  allow_dependent_launch();
  if constexpr (Shape::kDoubleBuffer) {
    Batch ping, pong;
    if (warp < units) load_batch(ping, warp);
    wait_for_prerequisite_grids();
    for (int first = warp; first < units; first += 2 * kStride) {
      const int second = first + kStride;
      if (second < units) load_batch(pong, second);
      use_batch(ping, first);
      if (second >= units) break;
      if (second + kStride < units) load_batch(ping, second + kStride);
      use_batch(pong, second);
    }
  } else {
    bool waited = false;
    for (int first = warp; first < units; first += kStride) {
      Batch raw;
      load_batch(raw, first);
      if (!waited) {
        wait_for_prerequisite_grids();
        waited = true;
      }
      use_batch(raw, first);
    }
    if (!waited) wait_for_prerequisite_grids();
  }

  store_quant_tile<kNvfp4, kRowTiles, kWarps, 16>(table, job, acc, row0, m, kNvfp4 ? kSectorsNvfp4Unscale : 1.0f);
}

}  // namespace ninfer::cuda::kernels
