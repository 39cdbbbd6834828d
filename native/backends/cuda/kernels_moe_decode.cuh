// Fused decode MoE kernels (see launchers_moe_decode.h): router + top-k, the selected experts'
// gate/up with SwiGLU, and their down projections with the routing-weighted sum and the gated
// shared expert, over weights in their stored format.
//
// Every product is a warp per output row: lane l reads the row's 16-byte chunks l, l + 32, ...
// (8 bf16, 16 e4m3 or 32 e2m1 values each), dequantizes them in registers and multiplies them
// with the activation row staged once per block in shared memory (f32). A lane keeps its
// partial sum of every row it reads, so a down row's k selected experts are one warp reduction.
// Scales: FP8 multiplies each chunk's partial sum by its 128x128 block scale; NVFP4 multiplies
// each half chunk (16 values) by its e4m3 group scale and the finished row by its f32 scale
// (folded into the routing weight for the down rows). Summation order is fixed: bits repeat.
// Each kernel may be launched overlapping the previous one (programmatic dependent launch): it
// reads nothing an earlier kernel writes before wait_for_prerequisite_grids().
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <climits>

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/launchers_moe_decode.h"

namespace ninfer::cuda::kernels {

namespace moe_cg = cooperative_groups;

inline constexpr int kMoeDecodeWarps = 8;    // output rows per block (one per warp)
inline constexpr int kMoeRouteCluster = 8;   // blocks per token of the routing kernel
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

__device__ __forceinline__ float moe_dot4(const float4 x, float2 a, float2 b) {
  return a.x * x.x + a.y * x.y + b.x * x.z + b.y * x.w;
}

// This lane's partial sum of row r (local to w.codes) of w against xs[w.k] (shared memory),
// without the NVFP4 row scale (moe_row_scale).
template <int F>
__device__ __forceinline__ float moe_lane_partial(const MoeWeightRef& w, int64_t r, const float* xs) {
  const int lane = threadIdx.x & 31;
  const int chunks = w.k / moe_chunk_cols(F);
  const uint8_t* row = w.codes + r * moe_row_bytes(F, w.k);
  const int64_t g = w.first_row + r;  // row of the whole tensor (scales)
  float acc = 0.0f;
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + 16 * static_cast<int64_t>(c)));
    const float4* x4 = reinterpret_cast<const float4*>(xs + static_cast<int64_t>(c) * moe_chunk_cols(F));
    if constexpr (F == kMoeFmtBf16) {
      float f[8];
      bf16x8_to_float(v, f);
      const float4 x0 = x4[0], x1 = x4[1];
      acc += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
             f[7] * x1.w;
    } else if constexpr (F == kMoeFmtFp8) {
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) s += moe_dot4(x4[i], moe_e4m3x2(words[i]), moe_e4m3x2(words[i] >> 16));
      const int row_blocks = (w.group_rows + 127) / 128, col_blocks = (w.k + 127) / 128;
      const auto* scales = static_cast<const float*>(w.scales);
      acc += s * __ldg(scales + ((g / w.group_rows) * row_blocks + (g % w.group_rows) / 128) * col_blocks + c / 8);
    } else {
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      float half_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t wd = words[i];
        // nibble j of word i is column 8i + j of the chunk; x4[2i], x4[2i + 1] hold those columns
        half_sum[i / 2] += moe_dot4(x4[2 * i], moe_e2m1x2_scaled(wd & 0xffu), moe_e2m1x2_scaled((wd >> 8) & 0xffu)) +
                           moe_dot4(x4[2 * i + 1], moe_e2m1x2_scaled((wd >> 16) & 0xffu),
                                    moe_e2m1x2_scaled(wd >> 24));
      }
      const auto* s8 = static_cast<const uint8_t*>(w.scales) + g * (w.k / 16) + 2 * c;
      const float2 gs = moe_e4m3x2(static_cast<uint32_t>(s8[0]) | (static_cast<uint32_t>(s8[1]) << 8));
      acc += half_sum[0] * gs.x + half_sum[1] * gs.y;
    }
  }
  return acc;
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

// Grid: tokens × kMoeRouteCluster blocks, one cluster per token. The cluster's blocks split the
// router's rows (and the shared expert's gate row, scored after the last expert) and keep their
// logits in shared memory; block 0's first warp reads them all through distributed shared
// memory and runs moe_route_softmax_topk's selection (ties to the lower expert id).
template <int PER_LANE>
__global__ void __cluster_dims__(kMoeRouteCluster, 1, 1) __launch_bounds__(kMoeDecodeWarps * 32)
    moe_decode_route(const MoeDecodeJob job) {
  extern __shared__ float route_sh[];  // x [hidden] | this block's logits
  moe_cg::cluster_group cluster = moe_cg::this_cluster();
  const int t = static_cast<int>(blockIdx.x) / kMoeRouteCluster;
  const int rank = static_cast<int>(cluster.block_rank());
  const bool has_gate = job.shared_gate_row.codes != nullptr;
  const int experts = job.num_experts, rows_total = experts + (has_gate ? 1 : 0);
  const int per_block = (rows_total + kMoeRouteCluster - 1) / kMoeRouteCluster;
  float* xs = route_sh;
  float* logits = route_sh + job.hidden;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  allow_dependent_launch();
  // The router's rows do not depend on earlier kernels: start pulling them into L2 while the
  // previous kernel (the norm that makes x) finishes.
  for (int i = warp; i < per_block; i += kMoeDecodeWarps) {
    const int r = rank * per_block + i;
    if (r >= experts) break;
    const int64_t bytes = moe_row_bytes(job.router.format, job.router.k);
    const uint8_t* row = job.router.codes + r * bytes;
    for (int64_t b = 128 * lane; b < bytes; b += 128 * 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
  }
  wait_for_prerequisite_grids();
  const float* xr = job.x + static_cast<int64_t>(t) * job.hidden;
  for (int i = threadIdx.x; i < job.hidden; i += blockDim.x) xs[i] = xr[i];
  __syncthreads();
  for (int i = warp; i < per_block; i += kMoeDecodeWarps) {
    const int r = rank * per_block + i;
    if (r >= rows_total) break;
    const float v = r < experts ? moe_row_dot_any(job.router, r, xs) : moe_row_dot_any(job.shared_gate_row, 0, xs);
    if (lane == 0) logits[i] = v;
  }
  cluster.sync();
  if (rank == 0 && warp == 0) {
    float p[PER_LANE];
    float mx = -FLT_MAX;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int e = lane + 32 * i;
      p[i] = e < experts ? cluster.map_shared_rank(logits, e / per_block)[e % per_block] : -FLT_MAX;
      mx = fmaxf(mx, p[i]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      p[i] = lane + 32 * i < experts ? expf(p[i] - mx) : -1.0f;  // -1: never chosen
      sum += fmaxf(p[i], 0.0f);
    }
    sum = warp_sum(sum);
    float chosen_sum = 0.0f, my_weight = 0.0f;
    int my_id = 0;
    for (int k = 0; k < job.top_k; ++k) {
      float best = -2.0f;
      int best_id = INT_MAX;
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i)
        if (p[i] > best) {  // ascending ids within a lane: strict > keeps the lower id on ties
          best = p[i];
          best_id = lane + 32 * i;
        }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, off);
        const int oid = __shfl_xor_sync(0xffffffffu, best_id, off);
        if (ob > best || (ob == best && oid < best_id)) {
          best = ob;
          best_id = oid;
        }
      }
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i)
        if (lane + 32 * i == best_id) p[i] = -1.0f;
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
    if (has_gate && lane == 0 && job.shared_gate_logit)
      job.shared_gate_logit[t] = cluster.map_shared_rank(logits, experts / per_block)[experts % per_block];
  }
  cluster.sync();  // every block's logits stay alive until block 0 has read them
}

// Grid: (row tiles of max(ff, shared_ff), pairs + tokens with a shared expert). Block (i, y)
// computes rows [8i, 8i + 8) of pair y's expert (y < pairs) or of token y - pairs's shared
// expert: act = silu(gate · x) · (up · x).
__global__ void __launch_bounds__(kMoeDecodeWarps * 32) moe_decode_gate_up(const MoeDecodeJob job) {
  extern __shared__ float gate_up_xs[];  // x [hidden]
  const int pairs = job.tokens * job.top_k;
  const int y = static_cast<int>(blockIdx.y);
  const bool shared = y >= pairs;
  const int t = shared ? y - pairs : y / job.top_k;
  const int rows = shared ? job.shared_ff : job.ff;
  allow_dependent_launch();
  if (static_cast<int>(blockIdx.x) * kMoeDecodeWarps >= rows) return;  // the whole block
  wait_for_prerequisite_grids();
  const float* xr = job.x + static_cast<int64_t>(t) * job.hidden;
  for (int i = threadIdx.x; i < job.hidden; i += blockDim.x) gate_up_xs[i] = xr[i];
  __syncthreads();
  const int j = static_cast<int>(blockIdx.x) * kMoeDecodeWarps + (threadIdx.x >> 5);
  if (j >= rows) return;
  float2 gu;
  if (!shared) {
    const int64_t base = static_cast<int64_t>(job.expert_ids[y]) * 2 * job.ff;
    gu = moe_row_dot2_any(job.gate_up, base + j, job.gate_up, base + job.ff + j, gate_up_xs);
  } else {
    gu = moe_row_dot2_any(job.shared_gate, j, job.shared_up, j, gate_up_xs);
  }
  if ((threadIdx.x & 31) == 0) {
    float* dst = shared ? job.act + static_cast<int64_t>(pairs) * job.ff + static_cast<int64_t>(t) * job.shared_ff
                        : job.act + static_cast<int64_t>(y) * job.ff;
    dst[j] = gu.x / (1.0f + expf(-gu.x)) * gu.y;
  }
}

// The routed down rows of one token: Σ_s weight_s · down_{e_s}[j] · act_s, lanes' partials only.
template <int F>
__device__ __forceinline__ float moe_routed_down_partial(const MoeDecodeJob& job, int t, int j, const float* acts) {
  float acc = 0.0f;
  for (int s = 0; s < job.top_k; ++s) {
    const int p = t * job.top_k + s;
    const int64_t r = static_cast<int64_t>(job.expert_ids[p]) * job.hidden + j;
    acc += job.route_weights[p] * moe_row_scale<F>(job.down, r) *
           moe_lane_partial<F>(job.down, r, acts + static_cast<int64_t>(s) * job.ff);
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
  extern __shared__ float down_acts[];  // the token's top_k act rows [top_k, ff] | shared [shared_ff]
  const int t = static_cast<int>(blockIdx.y);
  const int pairs = job.tokens * job.top_k;
  const int routed = job.top_k * job.ff;
  allow_dependent_launch();
  wait_for_prerequisite_grids();
  const float* a = job.act + static_cast<int64_t>(t) * routed;
  for (int i = threadIdx.x; i < routed; i += blockDim.x) down_acts[i] = a[i];
  if (job.shared_ff > 0) {
    const float* s = job.act + static_cast<int64_t>(pairs) * job.ff + static_cast<int64_t>(t) * job.shared_ff;
    for (int i = threadIdx.x; i < job.shared_ff; i += blockDim.x) down_acts[routed + i] = s[i];
  }
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
    const float* sa = down_acts + routed;
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
