// Decode GEMVs over FP8/NVFP4 weights for small batches (m <= 8) on fp16 tensor cores, with x
// staged once per block in shared memory.
//
// Why a second kernel (kernels_gemv_quant.cuh is the general one): at m <= 8 the general
// kernel is bound by instruction issue, not by memory (bench/RESULTS.md, 2026-12-01): every
// weight costs two instructions to reach bf16 (e4m3 → f16 → f32 → bf16), and every warp
// converts its own x fragments from f32 for each 128-k unit. Here:
// - the mma runs in fp16: e4m3x2 → f16x2 is one instruction (cvt.rn.f16x2.e4m3x2), exact;
//   e2m1 magnitudes have f16 encodings whose low byte is zero, so one byte permutation gives
//   four high bytes, and code × e4m3 group scale (at most 6 significant bits, between 2^-10
//   and 2688) is exact in f16;
// - x is rounded to bf16 (the value every other matmul path uses), times 2^-8, to f16 once
//   per block into shared memory, and warps read their fragments from there. The 2^-8 keeps
//   activations up to 2^23 inside f16's range; |x| below 2^-6 then lands on f16's subnormal
//   grid (absolute error at most 2^-17, below bf16's own rounding of x at that size). The
//   2^8 goes back in f32, with the block scale (FP8) or the row scale (NVFP4).
// The k layout, tiles, warp split and deterministic reduction are the general kernel's.
#pragma once

#include <cuda_fp16.h>

#include "backends/cuda/kernels_gemv_quant.cuh"

namespace ninfer::cuda::kernels {

inline constexpr float kStagedXScale = 1.0f / 256.0f;  // x is staged as f16 of x · 2^-8

// Two e4m3 codes (low byte first) as f16x2, exactly (one cvt).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ __forceinline__ uint4 e4m3x8_to_f16(uint32_t lo, uint32_t hi) {
  return {e4m3x2_to_f16x2(static_cast<uint16_t>(lo)), e4m3x2_to_f16x2(static_cast<uint16_t>(lo >> 16)),
          e4m3x2_to_f16x2(static_cast<uint16_t>(hi)), e4m3x2_to_f16x2(static_cast<uint16_t>(hi >> 16))};
}

// 8 e2m1 codes (code j in nibble j) as 8 f16 in k order. f16 of 0, .5, 1, 1.5, 2, 3, 4, 6 is
// 0x0000, 0x3800, 0x3C00, 0x3E00, 0x4000, 0x4200, 0x4400, 0x4600: high bytes from one table.
__device__ __forceinline__ uint4 e2m1x8_to_f16(uint32_t w) {
  constexpr uint32_t kHiA = 0x3E3C3800u, kHiB = 0x46444240u;
  const uint32_t h03 = __byte_perm(kHiA, kHiB, w & 0x7777u), h47 = __byte_perm(kHiA, kHiB, (w >> 16) & 0x7777u);
  // Byte b of w holds codes 2b (sign: bit 3) and 2b + 1 (bit 7); in w << 4 the former is bit 7.
  const uint32_t w4 = w << 4;
  const uint32_t s01 = __byte_perm(w4, w, 0x4400u), s23 = __byte_perm(w4, w, 0x5511u);
  const uint32_t s45 = __byte_perm(w4, w, 0x6622u), s67 = __byte_perm(w4, w, 0x7733u);
  constexpr uint32_t kSigns = 0x80008000u;
  // Selector 4 picks a zero byte (the second operand): [0, hi(code a), 0, hi(code b)].
  return {__byte_perm(h03, 0u, 0x1404u) | (s01 & kSigns), __byte_perm(h03, 0u, 0x3424u) | (s23 & kSigns),
          __byte_perm(h47, 0u, 0x1404u) | (s45 & kSigns), __byte_perm(h47, 0u, 0x3424u) | (s67 & kSigns)};
}

// An e4m3 code as f16x2 (the value in both halves).
__device__ __forceinline__ uint32_t e4m3_to_f16x2_splat(uint8_t code) {
  return e4m3x2_to_f16x2(static_cast<uint16_t>(code | (code << 8)));
}

__device__ __forceinline__ uint32_t f16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// x rounded to bf16 (as pack_bf16x2), then f16 of that times 2^-8: two values as f16x2.
__device__ __forceinline__ uint32_t staged_x_f16x2(float lo, float hi) {
  const uint32_t b = pack_bf16x2(lo, hi);
  const __half2 h = __floats2half2_rn(__uint_as_float(b << 16) * kStagedXScale,
                                      __uint_as_float(b & 0xFFFF0000u) * kStagedXScale);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// d += A (16×16 f16) · B (16×8 f16), f32 accumulators; rows 8-15 of A are zero (m <= 8).
__device__ __forceinline__ void mma_m16n8k16_f16_low(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                                     uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// Shared memory of the staged kernel: x as f16, rows padded by 16 bytes (no bank conflicts
// between the x rows of one warp).
inline size_t staged_x_bytes(int m, int k) { return static_cast<size_t>(m) * (k + 8) * 2; }

template <bool kNvfp4, int kRowTiles, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    gemv_quant_staged(const QuantGemvTable table, const float* __restrict__ x, int m, int k) {
  extern __shared__ uint4 staged_raw[];
  auto* xs = reinterpret_cast<uint16_t*>(staged_raw);
  const int xs_stride = k + 8;
  constexpr int kTileRows = 8 * kRowTiles;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, tig = lane & 3;
  int j = 0;
  while (static_cast<int>(blockIdx.x) >= table.first_tile[j + 1]) ++j;
  const QuantGemvJob& job = table.job[j];
  const int row0 = (static_cast<int>(blockIdx.x) - table.first_tile[j]) * kTileRows;
  const int units = (k + 127) / 128, col_blocks = units;
  const int64_t row_stride = kNvfp4 ? k / 2 : k;

  const uint8_t* w_lane[kRowTiles];
  int w_row[kRowTiles];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) {
    w_row[t] = min(row0 + 8 * t + group, job.rows - 1);
    w_lane[t] = job.codes + static_cast<int64_t>(w_row[t]) * row_stride + (kNvfp4 ? 16 : 32) * tig;
  }
  int acc_row[kRowTiles][2];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
    for (int i = 0; i < 2; ++i) acc_row[t][i] = min(row0 + 8 * t + 2 * tig + i, job.rows - 1);
  const bool x_live = group < m;
  const uint16_t* x_lane = xs + min(group, m - 1) * xs_stride + 32 * tig;

  float acc[kRowTiles][4];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  constexpr uint4 kZero = {0u, 0u, 0u, 0u};
  // Units of each warp loaded before any is used: 128 bytes of each weight row in flight per
  // lane with 8-row tiles (the m <= 2 form, whose blocks are many and short), 64 with 16-row.
  constexpr int kUnroll = (kNvfp4 ? 4 : 2) * (kRowTiles == 1 ? 2 : 1);
  using Batch = uint4[kUnroll][kRowTiles][2];
  auto load_batch = [&](int first_unit, Batch& raw) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int unit = first_unit + u * kWarps, kbase = unit * 128 + 32 * tig;
      const bool live_lo = unit < units && kbase + 16 <= k, live_hi = unit < units && kbase + 32 <= k;
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        const uint8_t* p = w_lane[t] + static_cast<int64_t>(unit) * (kNvfp4 ? 64 : 128);
        raw[u][t][0] = live_lo ? load_ahead16(p) : kZero;  // nvfp4: k % 32 == 0
        raw[u][t][1] = !kNvfp4 && live_hi ? load_ahead16(p + 16) : kZero;
      }
    }
  };

  allow_dependent_launch();
  // The first weights stream while the previous kernel finishes; x is ready after the wait.
  Batch raw;
  load_batch(warp, raw);
  wait_for_prerequisite_grids();
  const int per_row = k / 8;
  for (int i = threadIdx.x; i < m * per_row; i += 32 * kWarps) {
    const int r = i / per_row, c = (i - r * per_row) * 8;
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(r) * k + c));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(r) * k + c + 4));
    *reinterpret_cast<uint4*>(xs + r * xs_stride + c) = {staged_x_f16x2(a.x, a.y), staged_x_f16x2(a.z, a.w),
                                                         staged_x_f16x2(b.x, b.y), staged_x_f16x2(b.z, b.w)};
  }
  __syncthreads();

  for (int first_unit = warp; first_unit < units; first_unit += kWarps * kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int unit = first_unit + u * kWarps, kbase = unit * 128 + 32 * tig;
      if (unit >= units) break;
      bool live[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) live[s] = kbase + 8 * s + 8 <= k;
      uint32_t group_scale[kRowTiles][2];
      if constexpr (kNvfp4) {
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          const uint8_t* sp = static_cast<const uint8_t*>(job.scales) +
                              static_cast<int64_t>(job.first_row + w_row[t]) * (k / 16) + kbase / 16;
          const uint16_t both = live[0] ? __ldg(reinterpret_cast<const unsigned short*>(sp)) : 0;
          group_scale[t][0] = e4m3_to_f16x2_splat(static_cast<uint8_t>(both));
          group_scale[t][1] = e4m3_to_f16x2_splat(static_cast<uint8_t>(both >> 8));
        }
      }
      uint4 xf[4];
#pragma unroll
      for (int s = 0; s < 4; ++s)
        xf[s] = live[s] && x_live ? *reinterpret_cast<const uint4*>(x_lane + unit * 128 + 8 * s) : kZero;
      float part[kRowTiles][4];
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) part[t][0] = part[t][1] = part[t][2] = part[t][3] = 0.0f;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          uint4 w;
          if constexpr (kNvfp4) {
            const uint4& r = raw[u][t][0];
            const uint32_t word = s == 0 ? r.x : s == 1 ? r.y : s == 2 ? r.z : r.w;
            const uint4 v = e2m1x8_to_f16(word);
            const uint32_t g = group_scale[t][s / 2];
            w = {f16x2_mul(v.x, g), f16x2_mul(v.y, g), f16x2_mul(v.z, g), f16x2_mul(v.w, g)};
          } else {
            const uint4& r = raw[u][t][s / 2];
            w = (s & 1) ? e4m3x8_to_f16(r.z, r.w) : e4m3x8_to_f16(r.x, r.y);
          }
          float (&d)[4] = kNvfp4 ? acc[t] : part[t];
          mma_m16n8k16_f16_low(d, xf[s].x, xf[s].y, w.x, w.y);
          mma_m16n8k16_f16_low(d, xf[s].z, xf[s].w, w.z, w.w);
        }
      }
      if constexpr (!kNvfp4) {
        const float* scales = static_cast<const float*>(job.scales);
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          const float s0 = __ldg(scales + fp8_scale_index(job, acc_row[t][0], unit, col_blocks));
          const float s1 = __ldg(scales + fp8_scale_index(job, acc_row[t][1], unit, col_blocks));
          add_block_scaled(acc, part, t, s0, s1);
        }
      }
    }
    if (first_unit + kWarps * kUnroll < units) load_batch(first_unit + kWarps * kUnroll, raw);
  }

  store_quant_tile<kNvfp4, kRowTiles, kWarps, 8>(table, job, acc, row0, m, 1.0f / kStagedXScale);
}

}  // namespace ninfer::cuda::kernels
