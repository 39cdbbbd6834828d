// Decode GEMVs over FP8 (W8A16) and NVFP4 (W4A16) weights: y[m, n] = x[m, k] · W[n, k]^T with
// m <= 16, and the dequantization of such weights to bf16 (prefill: bf16 tiles for cuBLAS).
//
// The product runs on bf16 tensor cores exactly as kernels_gemv.cuh does (x in A, 8 weight
// rows in B, k permuted identically in both), with the weights dequantized in registers:
// - FP8: e4m3 → bf16 is exact (4 significant bits); each 128-k unit's mma partials go to a
//   temporary accumulator that the unit's 128×128 block scale (fp32) multiplies into the sum,
//   so the scale costs no precision.
// - NVFP4: an e2m1 code times its e4m3 group scale has at most 6 significant bits, exact in
//   bf16; the product is formed in bf16 before the mma, and the per-row f32 scale multiplies
//   the finished sum.
// The unit of k is 128: lane t of a quad covers k [32t, 32t + 32) of it (FP8: two 16-byte
// loads per weight row; NVFP4: one), warp w of the block takes units w, w + kWarps, ...
// Blocks own tiles of 8·kRowTiles weight rows (block split); warps add their partial sums in
// warp order through shared memory: deterministic.
#pragma once

#include <cuda_fp8.h>

#include "backends/cuda/kernels_gemv.cuh"
#include "backends/cuda/launchers_quant.h"

namespace ninfer::cuda::kernels {

using cuda::kQuantGemvMaxJobs;
using cuda::QuantGemvJob;

struct QuantGemvTable {
  QuantGemvJob job[kQuantGemvMaxJobs];
  int32_t first_tile[kQuantGemvMaxJobs + 1];
  int32_t num_jobs;
  int32_t accumulate;
};

// Two e4m3 codes (low byte first) as bf16x2, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16x2(f.x, f.y);
}

// 8 consecutive e4m3 codes (a uint2) as 8 bf16 (a uint4 in k order).
__device__ __forceinline__ uint4 e4m3x8_to_bf16(uint32_t lo, uint32_t hi) {
  return {e4m3x2_to_bf16x2(static_cast<uint16_t>(lo)), e4m3x2_to_bf16x2(static_cast<uint16_t>(lo >> 16)),
          e4m3x2_to_bf16x2(static_cast<uint16_t>(hi)), e4m3x2_to_bf16x2(static_cast<uint16_t>(hi >> 16))};
}

// 8 e2m1 codes (a 32-bit word, code j in nibble j) as 8 bf16 magnitudes·sign, by byte
// permutation: the low and high bytes of the bf16 values of the 8 magnitudes are two 8-byte
// tables, the signs come from the codes' bit 3.
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t w) {
  // bf16 of 0, 0.5, 1, 1.5, 2, 3, 4, 6: high bytes 00 3F 3F 3F 40 40 40 40, low 00 00 80 C0 00 40 80 C0.
  constexpr uint32_t kHiA = 0x3F3F3F00u, kHiB = 0x40404040u, kLoA = 0xC0800000u, kLoB = 0xC0804000u;
  const uint32_t sel_lo = w & 0x7777u, sel_hi = (w >> 16) & 0x7777u;
  const uint32_t h03 = __byte_perm(kHiA, kHiB, sel_lo), l03 = __byte_perm(kLoA, kLoB, sel_lo);
  const uint32_t h47 = __byte_perm(kHiA, kHiB, sel_hi), l47 = __byte_perm(kLoA, kLoB, sel_hi);
  // Byte b of w holds codes 2b (sign: bit 3) and 2b + 1 (bit 7); in w << 4 the former is bit 7.
  const uint32_t w4 = w << 4;
  const uint32_t s01 = __byte_perm(w4, w, 0x4400u), s23 = __byte_perm(w4, w, 0x5511u);
  const uint32_t s45 = __byte_perm(w4, w, 0x6622u), s67 = __byte_perm(w4, w, 0x7733u);
  constexpr uint32_t kSigns = 0x80008000u;
  return {__byte_perm(l03, h03, 0x5140u) | (s01 & kSigns), __byte_perm(l03, h03, 0x7362u) | (s23 & kSigns),
          __byte_perm(l47, h47, 0x5140u) | (s45 & kSigns), __byte_perm(l47, h47, 0x7362u) | (s67 & kSigns)};
}

// load_weights16 that the compiler keeps where it is written: issued ahead of the arithmetic
// on the batch before it (software pipelining), not sunk to its first use.
__device__ __forceinline__ uint4 load_ahead16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// An e4m3 code as bf16x2 (the value in both halves).
__device__ __forceinline__ uint32_t e4m3_to_bf16x2_splat(uint8_t code) {
  return e4m3x2_to_bf16x2(static_cast<uint16_t>(code | (code << 8)));
}

__device__ __forceinline__ uint4 scale_bf16x8(uint4 v, uint32_t s) {
  return {bf16x2_mul(v.x, s), bf16x2_mul(v.y, s), bf16x2_mul(v.z, s), bf16x2_mul(v.w, s)};
}

__device__ __forceinline__ int fp8_scale_index(const QuantGemvJob& job, int row, int unit, int col_blocks) {
  const int g = job.first_row + row;
  const int row_blocks = (job.group_rows + 127) / 128;
  return ((g / job.group_rows) * row_blocks + (g % job.group_rows) / 128) * col_blocks + unit;
}

// acc[t] += the 128-k unit's partial sums part[t] times the FP8 block scales of the lane's two
// accumulator rows (s0: rows of acc[t][0] and [2], s1: of [1] and [3]).
template <int kRowTiles>
__device__ __forceinline__ void add_block_scaled(float (&acc)[kRowTiles][4], const float (&part)[kRowTiles][4], int t,
                                                 float s0, float s1) {
  acc[t][0] += part[t][0] * s0;
  acc[t][1] += part[t][1] * s1;
  acc[t][2] += part[t][2] * s0;
  acc[t][3] += part[t][3] * s1;
}

// The outputs of a quantized GEMV tile from its warps' accumulators, already in shared memory
// as partial[w · kRowTiles·128 + value] (the mma layout): added in warp order, scaled (by
// `unscale`, a power of two, then the NVFP4 row scale), biased and stored (or added) for the x
// rows n < min(m, kXRows) of the tile that starts at row0. Threads 0 .. 32·kWarps - 1 share it.
template <bool kNvfp4, int kRowTiles, int kWarps, int kXRows>
__device__ __forceinline__ void write_quant_tile(const QuantGemvTable& table, const QuantGemvJob& job,
                                                 const float* partial, int row0, int m, float unscale) {
  constexpr int kTileRows = 8 * kRowTiles, kValues = kRowTiles * 4 * 32;
  for (int idx = threadIdx.x; idx < kXRows * kTileRows; idx += 32 * kWarps) {
    const int n = idx / kTileRows, r = idx % kTileRows, row = row0 + r;
    if (n >= m || row >= job.rows) continue;
    const int value = accumulator_index(n, r);
    float sum = partial[value];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += partial[w * kValues + value];
    sum *= unscale;
    if constexpr (kNvfp4) sum *= job.scale2[job.first_row + row];
    if (job.bias) sum += job.bias[row];
    float* out = job.y + static_cast<int64_t>(n) * job.rows + row;
    *out = table.accumulate ? *out + sum : sum;
  }
}

// The end of a block-per-tile quantized GEMV: the warps' accumulators meet in shared memory,
// then write_quant_tile.
template <bool kNvfp4, int kRowTiles, int kWarps, int kXRows>
__device__ __forceinline__ void store_quant_tile(const QuantGemvTable& table, const QuantGemvJob& job,
                                                 const float (&acc)[kRowTiles][4], int row0, int m, float unscale) {
  constexpr int kValues = kRowTiles * 4 * 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float partial[kWarps * kValues];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp * kValues + (t * 4 + i) * 32 + lane] = acc[t][i];
  __syncthreads();
  write_quant_tile<kNvfp4, kRowTiles, kWarps, kXRows>(table, job, partial, row0, m, unscale);
}

template <bool kNvfp4, int kRowTiles, int kWarps, bool kWide, bool kPipelined>
__global__ void __launch_bounds__(32 * kWarps)
    gemv_quant_block_split(const QuantGemvTable table, const float* __restrict__ x, int m, int k) {
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
  // The rows of this lane's accumulators: 8t + 2·tig + {0, 1} of the tile.
  int acc_row[kRowTiles][2];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
    for (int i = 0; i < 2; ++i) acc_row[t][i] = min(row0 + 8 * t + 2 * tig + i, job.rows - 1);
  const bool x_lo_live = group < m, x_hi_live = kWide && group + 8 < m;
  const float* x_lo = x + static_cast<int64_t>(min(group, m - 1)) * k + 32 * tig;
  const float* x_hi = x + static_cast<int64_t>(min(group + 8, m - 1)) * k + 32 * tig;

  float acc[kRowTiles][4];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  constexpr uint4 kZero = {0u, 0u, 0u, 0u};

  allow_dependent_launch();
  bool waited = false;
  // kUnroll units of each warp are loaded before any is used (64 bytes of each weight row in
  // flight per lane in either format). kPipelined: the next batch's loads are issued before
  // this batch is dequantized and multiplied, so a warp always has loads in flight (at the
  // cost of registers, so of blocks per SM).
  constexpr int kUnroll = kNvfp4 ? 4 : 2;
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
  Batch raw, next;
  if constexpr (kPipelined) load_batch(warp, raw);
  for (int first_unit = warp; first_unit < units; first_unit += kWarps * kUnroll) {
    // Weights first (they depend on no earlier kernel), then x.
    if constexpr (kPipelined)
      load_batch(first_unit + kWarps * kUnroll, next);
    else
      load_batch(first_unit, raw);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int unit = first_unit + u * kWarps, kbase = unit * 128 + 32 * tig;
      if (unit >= units) break;
      bool live[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) live[s] = kbase + 8 * s + 8 <= k;
      uint32_t group_scale[kRowTiles][2];  // nvfp4: the two e4m3 group scales of this lane's 32 k
      if constexpr (kNvfp4) {
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          const uint8_t* sp = static_cast<const uint8_t*>(job.scales) +
                              static_cast<int64_t>(job.first_row + w_row[t]) * (k / 16) + kbase / 16;
          const uint16_t both = live[0] ? __ldg(reinterpret_cast<const unsigned short*>(sp)) : 0;
          group_scale[t][0] = e4m3_to_bf16x2_splat(static_cast<uint8_t>(both));
          group_scale[t][1] = e4m3_to_bf16x2_splat(static_cast<uint8_t>(both >> 8));
        }
      }
      if (!waited) {
        wait_for_prerequisite_grids();
        waited = true;
      }
      uint4 lo[4], hi[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        lo[s] = live[s] && x_lo_live ? load_x8_bf16_coherent(x_lo + unit * 128 + 8 * s) : kZero;
        hi[s] = live[s] && x_hi_live ? load_x8_bf16_coherent(x_hi + unit * 128 + 8 * s) : kZero;
      }
      float part[kRowTiles][4];
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) part[t][0] = part[t][1] = part[t][2] = part[t][3] = 0.0f;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint4 w[kRowTiles];
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          if constexpr (kNvfp4) {
            const uint4& r = raw[u][t][0];
            const uint32_t word = s == 0 ? r.x : s == 1 ? r.y : s == 2 ? r.z : r.w;
            w[t] = scale_bf16x8(e2m1x8_to_bf16(word), group_scale[t][s / 2]);
          } else {
            const uint4& r = raw[u][t][s / 2];
            w[t] = (s & 1) ? e4m3x8_to_bf16(r.z, r.w) : e4m3x8_to_bf16(r.x, r.y);
          }
        }
        if constexpr (kNvfp4)
          mma_chunk(acc, w, lo[s], hi[s]);
        else
          mma_chunk(part, w, lo[s], hi[s]);
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
    if constexpr (kPipelined) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) raw[u][t][0] = next[u][t][0], raw[u][t][1] = next[u][t][1];
    }
  }
  if (!waited) wait_for_prerequisite_grids();

  store_quant_tile<kNvfp4, kRowTiles, kWarps, 16>(table, job, acc, row0, m, 1.0f);
}

// out[r, c] = bf16 of the dequantized weight (rows [0, rows) of the job's weight), one thread
// per 8 consecutive values. FP8: code × block scale rounded once; NVFP4: (code × group
// scale) × row scale rounded once, as the CPU reference computes them in f32.
template <bool kNvfp4>
__global__ void dequantize_to_bf16(const QuantGemvJob job, int k, uint16_t* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // group of 8
  const int64_t per_row = k / 8;
  if (i >= static_cast<int64_t>(job.rows) * per_row) return;
  const int row = static_cast<int>(i / per_row), c0 = static_cast<int>(i % per_row) * 8;
  const int g = job.first_row + row;
  float v[8];
  if constexpr (kNvfp4) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(job.codes + static_cast<int64_t>(row) * (k / 2) + c0 / 2);
    const uint8_t s = static_cast<const uint8_t*>(job.scales)[static_cast<int64_t>(g) * (k / 16) + c0 / 16];
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s), __NV_E4M3);
    const float2 sf = __half22float2(*reinterpret_cast<const __half2*>(&h));
    bf16x8_to_float(e2m1x8_to_bf16(word), v);
    const float row_scale = job.scale2[g];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = v[e] * sf.x * row_scale;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(job.codes + static_cast<int64_t>(row) * k + c0);
    bf16x8_to_float(e4m3x8_to_bf16(raw.x, raw.y), v);
    const int row_blocks = (job.group_rows + 127) / 128, col_blocks = (k + 127) / 128;
    const float scale = static_cast<const float*>(
        job.scales)[((g / job.group_rows) * row_blocks + (g % job.group_rows) / 128) * col_blocks + c0 / 128];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= scale;
  }
  uint4 packed = {pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7])};
  *reinterpret_cast<uint4*>(out + static_cast<int64_t>(row) * k + c0) = packed;
}

}  // namespace ninfer::cuda::kernels
