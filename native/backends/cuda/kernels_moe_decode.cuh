// Fused decode MoE kernels (see launchers_moe_decode.h): router + top-k, the selected experts'
// gate/up with SwiGLU, and their down projections with the routing-weighted sum and the gated
// shared expert, over weights in their stored format.
//
// Every product is a warp per output row: lane l reads the row's 16-byte chunks l, l + 32, ...
// (8 bf16, 16 e4m3 or 32 e2m1 values each), dequantizes them in registers and multiplies them
// with the activation row staged once per block in shared memory (f32, swizzled: moe_xs4). A lane keeps its
// partial sum of every row it reads, so a down row's k selected experts are one warp reduction.
// Scales: FP8 multiplies each chunk's partial sum by its 128x128 block scale; NVFP4 multiplies
// each half chunk (16 values) by its e4m3 group scale and the finished row by its f32 scale
// (folded into the routing weight for the down rows). Summation order is fixed: bits repeat.
// Each kernel may be launched overlapping the previous one (programmatic dependent launch): it
// reads nothing an earlier kernel writes before wait_for_prerequisite_grids().
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <climits>

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/launchers_moe_decode.h"

namespace ninfer::cuda::kernels {

inline constexpr int kMoeDecodeWarps = 8;    // output rows per block (one per warp)
inline constexpr int kMoeGateUpRowsPerBlock = 2 * kMoeDecodeWarps;  // gate/up: two output rows a warp
inline constexpr int kMoeFmtBf16 = 0, kMoeFmtFp8 = 1, kMoeFmtNvfp4 = 2;

__host__ __device__ constexpr int moe_chunk_cols(int format) {
  return format == kMoeFmtNvfp4 ? 32 : format == kMoeFmtFp8 ? 16 : 8;
}

__host__ __device__ constexpr int64_t moe_row_bytes(int format, int64_t k) {
  return format == kMoeFmtNvfp4 ? k / 2 : format == kMoeFmtFp8 ? k : 2 * k;
}

// Two e4m3 codes (low byte first) as floats, exactly.
__device__ __forceinline__ float2 moe_e4m3x2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// The two e2m1 codes of a byte (low nibble first) as floats times 2^-14: the code's bits placed
// as an fp16's exponent and top mantissa bit (subnormal for exponent 0) scale the e2m1 value by
// exactly 2^-14; the caller multiplies 2^14 back into the row scale.
__device__ __forceinline__ float2 moe_e2m1x2_scaled(uint32_t byte) {
  const uint32_t bits = ((byte & 7u) << 9) | ((byte & 8u) << 12) | ((byte & 0x70u) << 21) | ((byte & 0x80u) << 24);
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

// Activation rows in shared memory: float4 g of a row sits at g ^ ((g >> 3) & 7), each row on a
// 32-float boundary (moe_xs_stride). A warp reads the float4s of chunks lane, lane + 32, ... (2 a
// chunk for bf16, 4 for FP8, 8 for NVFP4); in row order the 8 lanes of a 128-bit shared-memory
// phase land on 4, 2 or 1 of the 8 16-byte bank groups (2-, 4- and 8-way conflicts on every
// read, the quantized formats' worst), and the XOR spreads each phase over all 8. The values and
// the order they are summed in are unchanged: bits repeat those of the row-order layout.
__host__ __device__ constexpr int moe_xs_stride(int n) { return (n + 31) & ~31; }

__device__ __forceinline__ float4 moe_xs4(const float* row, int g) {
  return reinterpret_cast<const float4*>(row)[g ^ ((g >> 3) & 7)];
}

// rows x n floats from src (row-major, dense) into dst, row r at r * moe_xs_stride(n), swizzled.
__device__ __forceinline__ void moe_stage_rows(float* dst, const float* src, int rows, int n) {
  const int stride = moe_xs_stride(n);
  for (int i = threadIdx.x; i < rows * n; i += blockDim.x) {
    const int r = i / n, e = i - r * n, g = e >> 2;
    dst[r * stride + 4 * (g ^ ((g >> 3) & 7)) + (e & 3)] = src[i];
  }
}

__device__ __forceinline__ float moe_dot4(const float4 x, float2 a, float2 b) {
  return a.x * x.x + a.y * x.y + b.x * x.z + b.y * x.w;
}

// Where row r's scales start (FP8: its row of 128x128 block scales, f32; NVFP4: its e4m3 group
// scales, two a chunk; bf16: none). Once a row, not once a chunk: the FP8 form divides by the
// stack's group rows.
template <int F>
__device__ __forceinline__ const uint8_t* moe_scale_row(const MoeWeightRef& w, int64_t r) {
  const int64_t g = w.first_row + r;  // row of the whole tensor (scales)
  if constexpr (F == kMoeFmtFp8) {
    const int row_blocks = (w.group_rows + 127) / 128, col_blocks = (w.k + 127) / 128;
    const int64_t block_row = (g / w.group_rows) * row_blocks + (g % w.group_rows) / 128;
    return static_cast<const uint8_t*>(w.scales) + 4 * block_row * col_blocks;
  } else if constexpr (F == kMoeFmtNvfp4) {
    return static_cast<const uint8_t*>(w.scales) + g * (w.k / 16);
  } else {
    return nullptr;
  }
}

// The scale bits of chunk c (FP8: its f32 block scale; NVFP4: its two e4m3 group scales, the
// lower half first), loaded beside the chunk's codes so that both reads are in flight together.
template <int F>
__device__ __forceinline__ uint32_t moe_chunk_scale(const uint8_t* scale_row, int c) {
  if constexpr (F == kMoeFmtFp8) return __float_as_uint(__ldg(reinterpret_cast<const float*>(scale_row) + c / 8));
  else if constexpr (F == kMoeFmtNvfp4) return __ldg(reinterpret_cast<const unsigned short*>(scale_row) + c);
  else return 0u;
}

// Chunk c (16 bytes at v, scale bits from moe_chunk_scale) of a row against xs (staged by
// moe_stage_rows).
template <int F>
__device__ __forceinline__ float moe_chunk_dot(int c, const uint4 v, uint32_t scale, const float* xs) {
  const int g0 = c * (moe_chunk_cols(F) / 4);  // the chunk's first float4
  if constexpr (F == kMoeFmtBf16) {
    float f[8];
    bf16x8_to_float(v, f);
    const float4 x0 = moe_xs4(xs, g0), x1 = moe_xs4(xs, g0 + 1);
    return f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
           f[7] * x1.w;
  } else if constexpr (F == kMoeFmtFp8) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) s += moe_dot4(moe_xs4(xs, g0 + i), moe_e4m3x2(words[i]), moe_e4m3x2(words[i] >> 16));
    return s * __uint_as_float(scale);
  } else {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    float half_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t wd = words[i];
      // nibble j of word i is column 8i + j of the chunk; float4s 2i and 2i + 1 hold those columns
      half_sum[i / 2] +=
          moe_dot4(moe_xs4(xs, g0 + 2 * i), moe_e2m1x2_scaled(wd & 0xffu), moe_e2m1x2_scaled((wd >> 8) & 0xffu)) +
          moe_dot4(moe_xs4(xs, g0 + 2 * i + 1), moe_e2m1x2_scaled((wd >> 16) & 0xffu), moe_e2m1x2_scaled(wd >> 24));
    }
    const float2 gs = moe_e4m3x2(scale);
    return half_sum[0] * gs.x + half_sum[1] * gs.y;
  }
}

// This lane's partial sum of row r (local to w.codes) of w against xs[w.k] (shared memory),
// without the NVFP4 row scale (moe_row_scale).
template <int F>
__device__ __forceinline__ float moe_lane_partial(const MoeWeightRef& w, int64_t r, const float* xs) {
  const int lane = threadIdx.x & 31;
  const int chunks = w.k / moe_chunk_cols(F);
  const uint8_t* row = w.codes + r * moe_row_bytes(F, w.k);
  const uint8_t* scale_row = moe_scale_row<F>(w, r);
  float acc = 0.0f;
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + 16 * static_cast<int64_t>(c)));
    acc += moe_chunk_dot<F>(c, v, moe_chunk_scale<F>(scale_row, c), xs);
  }
  return acc;
}

// moe_lane_partial of N rows at once (row n: r[n] of a for even n, of b for odd n, against
// xs[n]; one format and one width k), every row's chunk and scale loaded before any is used,
// so a lane has N reads in flight where N separate calls would wait for one after another
// (a 512-wide FP8 row is one chunk a lane). Each row's sum runs in the order of moe_lane_partial.
template <int F, int N>
__device__ __forceinline__ void moe_lane_partials(const MoeWeightRef& a, const MoeWeightRef& b, const int64_t (&r)[N],
                                                  const float* const (&xs)[N], float (&acc)[N]) {
  const int lane = threadIdx.x & 31;
  const int chunks = a.k / moe_chunk_cols(F);
  const int64_t row_bytes = moe_row_bytes(F, a.k);
  const uint8_t* row[N];
  const uint8_t* scale_row[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    acc[n] = 0.0f;
    row[n] = (n % 2 ? b : a).codes + r[n] * row_bytes;
    scale_row[n] = moe_scale_row<F>(n % 2 ? b : a, r[n]);
  }
#pragma unroll 1
  for (int c = lane; c < chunks; c += 32) {
    uint4 v[N];
    uint32_t sc[N];
#pragma unroll
    for (int n = 0; n < N; ++n) {
      v[n] = __ldg(reinterpret_cast<const uint4*>(row[n] + 16 * static_cast<int64_t>(c)));
      sc[n] = moe_chunk_scale<F>(scale_row[n], c);
    }
#pragma unroll
    for (int n = 0; n < N; ++n) acc[n] += moe_chunk_dot<F>(c, v[n], sc[n], xs[n]);
  }
}

// What a finished row sum of moe_lane_partial<F> is multiplied by (NVFP4: its f32 row scale and
// the 2^14 of moe_e2m1x2_scaled).
template <int F>
__device__ __forceinline__ float moe_row_scale(const MoeWeightRef& w, int64_t r) {
  if constexpr (F == kMoeFmtNvfp4) return __ldg(w.scale2 + w.first_row + r) * 16384.0f;
  return 1.0f;
}

template <int F>
__device__ __forceinline__ float moe_row_dot(const MoeWeightRef& w, int64_t r, const float* xs) {
  return warp_sum(moe_lane_partial<F>(w, r, xs)) * moe_row_scale<F>(w, r);
}

__device__ __forceinline__ float moe_row_dot_any(const MoeWeightRef& w, int64_t r, const float* xs) {
  switch (w.format) {
    case kMoeFmtFp8: return moe_row_dot<kMoeFmtFp8>(w, r, xs);
    case kMoeFmtNvfp4: return moe_row_dot<kMoeFmtNvfp4>(w, r, xs);
    default: return moe_row_dot<kMoeFmtBf16>(w, r, xs);
  }
}

// Rows ra of a and rb of b (one format) against the same xs, both reads in flight together.
template <int F>
__device__ __forceinline__ float2 moe_row_dot2(const MoeWeightRef& a, int64_t ra, const MoeWeightRef& b, int64_t rb,
                                               const float* xs) {
  const float pa = moe_lane_partial<F>(a, ra, xs), pb = moe_lane_partial<F>(b, rb, xs);
  return {warp_sum(pa) * moe_row_scale<F>(a, ra), warp_sum(pb) * moe_row_scale<F>(b, rb)};
}

__device__ __forceinline__ float2 moe_row_dot2_any(const MoeWeightRef& a, int64_t ra, const MoeWeightRef& b,
                                                   int64_t rb, const float* xs) {
  if (a.format != b.format) return {moe_row_dot_any(a, ra, xs), moe_row_dot_any(b, rb, xs)};
  switch (a.format) {
    case kMoeFmtFp8: return moe_row_dot2<kMoeFmtFp8>(a, ra, b, rb, xs);
    case kMoeFmtNvfp4: return moe_row_dot2<kMoeFmtNvfp4>(a, ra, b, rb, xs);
    default: return moe_row_dot2<kMoeFmtBf16>(a, ra, b, rb, xs);
  }
}

// Grid: (moe_route_blocks, tokens). Block b scores router rows [8b, 8b + 8) of token t, one per
// warp (row `experts` is the shared expert's gate, written straight to shared_gate_logit), into
// route_logits; the token's last block to arrive (route_arrivals[t], an atomic count that this
// block puts back to 0 for the next launch) reads them all and runs the softmax / top-k
// (ties to the lower expert id). Spreading the router's rows over ~33 blocks instead of one
// 8-block cluster a token lets ~33 SMs pull the 1 MB (bf16) router instead of 8.
template <int PER_LANE>
__global__ void __launch_bounds__(kMoeDecodeWarps * 32) moe_decode_route(const MoeDecodeJob job) {
  extern __shared__ float4 route_smem[];  // x [hidden] (moe_stage_rows)
  float* route_xs = reinterpret_cast<float*>(route_smem);
  __shared__ bool last_block;
  const int t = static_cast<int>(blockIdx.y);
  const bool has_gate = job.shared_gate_row.codes != nullptr;
  const int experts = job.num_experts, rows_total = experts + (has_gate ? 1 : 0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = static_cast<int>(blockIdx.x) * kMoeDecodeWarps + warp;
  allow_dependent_launch();
  // The router's rows do not depend on earlier kernels: start pulling them into L2 while the
  // previous kernel (the norm that makes x) finishes.
  if (r < experts) {
    const int64_t bytes = moe_row_bytes(job.router.format, job.router.k);
    const uint8_t* row = job.router.codes + r * bytes;
    for (int64_t b = 128 * lane; b < bytes; b += 128 * 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
  }
  wait_for_prerequisite_grids();
  moe_stage_rows(route_xs, job.x + static_cast<int64_t>(t) * job.hidden, 1, job.hidden);
  __syncthreads();
  if (r < rows_total) {
    const float v = r < experts ? moe_row_dot_any(job.router, r, route_xs)
                                : moe_row_dot_any(job.shared_gate_row, 0, route_xs);
    if (lane == 0) {
      if (r < experts) job.route_logits[static_cast<int64_t>(t) * experts + r] = v;
      else if (job.shared_gate_logit) job.shared_gate_logit[t] = v;
      __threadfence();  // the logit is visible device-wide before this block counts itself in
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(job.route_arrivals + t, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last_block || warp != 0) return;
  __threadfence();
  const float* logits = job.route_logits + static_cast<int64_t>(t) * experts;
  float p[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? __ldcg(logits + e) : -FLT_MAX;  // L2: other blocks wrote them
  }
  const float sum = warp_softmax_numerators(p, lane, experts);
  float chosen_sum = 0.0f, my_weight = 0.0f;
  int my_id = 0;
  for (int k = 0; k < job.top_k; ++k) {
    float best;
    int best_id;
    warp_take_largest(p, lane, best, best_id);
    const float prob = best / sum;
    chosen_sum += prob;
    if (lane == k) {
      my_weight = prob;
      my_id = best_id;
    }
  }
  if (lane < job.top_k) {
    job.expert_ids[t * job.top_k + lane] = my_id;
    job.route_weights[t * job.top_k + lane] = job.renormalize ? my_weight / chosen_sum : my_weight;
  }
  if (lane == 0) job.route_arrivals[t] = 0u;
}

// Rows (ra0, rb0) and (ra1, rb1) of a and b against the same xs, all four reads in flight together.
template <int F>
__device__ __forceinline__ float4 moe_row_dot4(const MoeWeightRef& a, int64_t ra0, int64_t ra1, const MoeWeightRef& b,
                                               int64_t rb0, int64_t rb1, const float* xs) {
  const int64_t rows[4] = {ra0, rb0, ra1, rb1};
  const float* const x[4] = {xs, xs, xs, xs};
  float p[4];
  moe_lane_partials<F, 4>(a, b, rows, x, p);
  return {warp_sum(p[0]) * moe_row_scale<F>(a, ra0), warp_sum(p[1]) * moe_row_scale<F>(b, rb0),
          warp_sum(p[2]) * moe_row_scale<F>(a, ra1), warp_sum(p[3]) * moe_row_scale<F>(b, rb1)};
}

__device__ __forceinline__ float4 moe_row_dot4_any(const MoeWeightRef& a, int64_t ra0, int64_t ra1,
                                                   const MoeWeightRef& b, int64_t rb0, int64_t rb1, const float* xs) {
  if (a.format != b.format || a.k != b.k) {
    const float2 first = moe_row_dot2_any(a, ra0, b, rb0, xs), second = moe_row_dot2_any(a, ra1, b, rb1, xs);
    return {first.x, first.y, second.x, second.y};
  }
  // FP8 and NVFP4 take the rows a pair at a time, each row's chunks 4-unrolled
  // (moe_lane_partial). On the H200 (2026-12-02, bench/RESULTS.md) FP8 through the 4-row,
  // 1-unrolled form ran the 35B-A3B b1 step ~0.4 ms slower than the earlier one-pair-a-warp
  // kernel, while NVFP4 in this pairwise form gained ~0.4 ms; the 4-row form with the NVFP4
  // decode needs ~100 registers (2 blocks an SM, a second wave again).
  switch (a.format) {
    case kMoeFmtFp8: {
      const float2 first = moe_row_dot2<kMoeFmtFp8>(a, ra0, b, rb0, xs);
      const float2 second = moe_row_dot2<kMoeFmtFp8>(a, ra1, b, rb1, xs);
      return {first.x, first.y, second.x, second.y};
    }
    case kMoeFmtNvfp4: {
      const float2 first = moe_row_dot2<kMoeFmtNvfp4>(a, ra0, b, rb0, xs);
      const float2 second = moe_row_dot2<kMoeFmtNvfp4>(a, ra1, b, rb1, xs);
      return {first.x, first.y, second.x, second.y};
    }
    default: return moe_row_dot4<kMoeFmtBf16>(a, ra0, ra1, b, rb0, rb1, xs);
  }
}

// Grid: (row tiles of max(ff, shared_ff), pairs + tokens with a shared expert). Block (i, y)
// computes rows [16i, 16i + 16) of pair y's expert (y < pairs) or of token y - pairs's shared
// expert, two rows a warp: act = silu(gate · x) · (up · x). Two rows a warp halve the blocks
// (the 35B-A3B b1 launch, 9 matrices of 512 rows: 288 blocks, one wave, where one row a warp
// needed 576 against ~528 resident) and double each warp's reads in flight.
__global__ void __launch_bounds__(kMoeDecodeWarps * 32) moe_decode_gate_up(const MoeDecodeJob job) {
  extern __shared__ float4 gate_up_smem[];  // x [hidden] (moe_stage_rows)
  float* gate_up_xs = reinterpret_cast<float*>(gate_up_smem);
  const int pairs = job.tokens * job.top_k;
  const int y = static_cast<int>(blockIdx.y);
  const bool shared = y >= pairs;
  const int t = shared ? y - pairs : y / job.top_k;
  const int rows = shared ? job.shared_ff : job.ff;
  allow_dependent_launch();
  if (static_cast<int>(blockIdx.x) * kMoeGateUpRowsPerBlock >= rows) return;  // the whole block
  wait_for_prerequisite_grids();
  moe_stage_rows(gate_up_xs, job.x + static_cast<int64_t>(t) * job.hidden, 1, job.hidden);
  __syncthreads();
  const int j0 = static_cast<int>(blockIdx.x) * kMoeGateUpRowsPerBlock + 2 * (threadIdx.x >> 5);
  if (j0 >= rows) return;
  const bool second = j0 + 1 < rows;
  const int j1 = second ? j0 + 1 : j0;  // a lone last row reads itself twice
  float4 gu;
  if (!shared) {
    const int64_t base = static_cast<int64_t>(job.expert_ids[y]) * 2 * job.ff;
    gu = moe_row_dot4_any(job.gate_up, base + j0, base + j1, job.gate_up, base + job.ff + j0, base + job.ff + j1,
                          gate_up_xs);
  } else {
    gu = moe_row_dot4_any(job.shared_gate, j0, j1, job.shared_up, j0, j1, gate_up_xs);
  }
  if ((threadIdx.x & 31) == 0) {
    float* dst = shared ? job.act + static_cast<int64_t>(pairs) * job.ff + static_cast<int64_t>(t) * job.shared_ff
                        : job.act + static_cast<int64_t>(y) * job.ff;
    dst[j0] = gu.x / (1.0f + expf(-gu.x)) * gu.y;
    if (second) dst[j1] = gu.z / (1.0f + expf(-gu.z)) * gu.w;
  }
}

// The routed down rows of one token: Σ_s weight_s · down_{e_s}[j] · act_s, lanes' partials only,
// summed in slot order; the slots' rows are read four at a time (moe_lane_partials).
template <int F>
__device__ __forceinline__ float moe_routed_down_partial(const MoeDecodeJob& job, int t, int j, const float* acts) {
  constexpr int kSlots = 4;
  float acc = 0.0f;
  for (int s0 = 0; s0 < job.top_k; s0 += kSlots) {
    int64_t rows[kSlots];
    const float* x[kSlots];
#pragma unroll
    for (int u = 0; u < kSlots; ++u) {
      const int s = min(s0 + u, job.top_k - 1);  // past top_k: slot top_k - 1 again, not summed
      rows[u] = static_cast<int64_t>(job.expert_ids[t * job.top_k + s]) * job.hidden + j;
      x[u] = acts + s * moe_xs_stride(job.ff);
    }
    float part[kSlots];
    moe_lane_partials<F, kSlots>(job.down, job.down, rows, x, part);
#pragma unroll
    for (int u = 0; u < kSlots; ++u)
      if (s0 + u < job.top_k)
        acc += job.route_weights[t * job.top_k + s0 + u] * moe_row_scale<F>(job.down, rows[u]) * part[u];
  }
  return acc;
}

template <int F>
__device__ __forceinline__ float moe_shared_down_partial(const MoeDecodeJob& job, int j, const float* acts,
                                                         float gate) {
  return gate * moe_row_scale<F>(job.shared_down, j) * moe_lane_partial<F>(job.shared_down, j, acts);
}

// Grid: (row tiles of hidden, tokens). out[t, j] = Σ_s w_s · down_{e_s}(act_s)[j] (slot order)
// + sigmoid(shared_gate_logit[t]) · shared_down(act_shared)[j]; overwritten, not accumulated.
__global__ void __launch_bounds__(kMoeDecodeWarps * 32) moe_decode_down(const MoeDecodeJob job) {
  extern __shared__ float4 down_smem[];  // the token's top_k act rows, then the shared one (moe_stage_rows)
  float* down_acts = reinterpret_cast<float*>(down_smem);
  const int t = static_cast<int>(blockIdx.y);
  const int pairs = job.tokens * job.top_k;
  const int routed = job.top_k * job.ff;
  allow_dependent_launch();
  wait_for_prerequisite_grids();
  const int shared_at = job.top_k * moe_xs_stride(job.ff);
  moe_stage_rows(down_acts, job.act + static_cast<int64_t>(t) * routed, job.top_k, job.ff);
  if (job.shared_ff > 0)
    moe_stage_rows(down_acts + shared_at,
                   job.act + static_cast<int64_t>(pairs) * job.ff + static_cast<int64_t>(t) * job.shared_ff, 1,
                   job.shared_ff);
  __syncthreads();
  const int j = static_cast<int>(blockIdx.x) * kMoeDecodeWarps + (threadIdx.x >> 5);
  if (j >= job.hidden) return;
  float acc;
  switch (job.down.format) {
    case kMoeFmtFp8: acc = moe_routed_down_partial<kMoeFmtFp8>(job, t, j, down_acts); break;
    case kMoeFmtNvfp4: acc = moe_routed_down_partial<kMoeFmtNvfp4>(job, t, j, down_acts); break;
    default: acc = moe_routed_down_partial<kMoeFmtBf16>(job, t, j, down_acts); break;
  }
  acc = warp_sum(acc);
  if (job.shared_ff > 0) {
    const float gate = job.shared_gate_logit ? 1.0f / (1.0f + expf(-job.shared_gate_logit[t])) : 1.0f;
    const float* sa = down_acts + shared_at;
    float sh;
    switch (job.shared_down.format) {
      case kMoeFmtFp8: sh = moe_shared_down_partial<kMoeFmtFp8>(job, j, sa, gate); break;
      case kMoeFmtNvfp4: sh = moe_shared_down_partial<kMoeFmtNvfp4>(job, j, sa, gate); break;
      default: sh = moe_shared_down_partial<kMoeFmtBf16>(job, j, sa, gate); break;
    }
    acc += warp_sum(sh);
  }
  if ((threadIdx.x & 31) == 0) job.out[static_cast<int64_t>(t) * job.hidden + j] = acc;
}

}  // namespace ninfer::cuda::kernels
