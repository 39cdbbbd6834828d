// Row RMSNorms as inline device code only, so that any kernel file can include them: the
// per-row norm of one warp (kernels_hybrid.cuh's row_norm_warps, and the FP8 prefill producer
// that quantizes the GDN output's gated norm) and the block-a-row norm of rows of 128-column
// groups (kernels_elementwise.cuh's rms_norm / add_rms_norm, and the FP8 prefill producer that
// quantizes the residual add + norm).
#pragma once

#include "backends/cuda/kernels_common.cuh"

namespace ninfer::cuda::kernels {

// One row of row_norm for rows of dim = 128 · kVec, by one warp: lane l holds columns
// 4l + 128v (v < kVec) in registers, so x is read once and every access is a 16-byte vector;
// y gets the lane's outputs. The expression is row_norm's, value by value.
template <bool ZERO_CENTERED, bool GATED, int kVec>
__device__ __forceinline__ void row_norm_warp_values(const float* xr, const float* __restrict__ zr,
                                                     const float* __restrict__ weight, float eps, int lane,
                                                     float4 (&y)[kVec]) {
  float4 v[kVec];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    v[i] = reinterpret_cast<const float4*>(xr)[lane + 32 * i];
    sum += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  const float inv = rsqrtf(warp_sum(sum) / static_cast<float>(128 * kVec) + eps);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float4 w = reinterpret_cast<const float4*>(weight)[lane + 32 * i];
    float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (GATED) g = reinterpret_cast<const float4*>(zr)[lane + 32 * i];
    const auto one = [&](float xv, float wv, float gv) {
      float out = xv * inv * (ZERO_CENTERED ? 1.0f + wv : wv);
      if constexpr (GATED) out *= gv / (1.0f + expf(-gv));
      return out;
    };
    y[i] = make_float4(one(v[i].x, w.x, g.x), one(v[i].y, w.y, g.y), one(v[i].z, w.z, g.z), one(v[i].w, w.w, g.w));
  }
}

// The sum of `sum` over the block (every thread gets it); partial is 32 floats of shared memory.
__device__ __forceinline__ float norm_block_sum(float sum, float* partial) {
  sum = warp_sum(sum);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

// The block-a-row RMSNorm of rows of 128-column groups (rms_norm, and with kAdd add_rms_norm's
// h += branch first): warp w of the block's W warps holds groups w + W·i (i < kPerWarp) of the
// row, lane l columns 4l..4l+3 of each, in float4 registers. Every load is a 16-byte vector
// issued before the first use, and each 128-column group lies in one warp's registers, so a
// consumer that reduces per group (the FP8 quantizer, kernels_fp8_prefill.cuh) takes the normed
// values from registers. v gets the normed row; with kAdd, hr gets h + branch. The sum runs in
// the same order for rms_norm and add_rms_norm, so the two give the same bits.
inline constexpr int kVecNormThreads = 256;  // the blocks of vec_norm_row's kernels (launch_per_row.h)
template <int kPerWarp, bool kAdd>
__device__ __forceinline__ void vec_norm_row(float* hr, const float* __restrict__ br, int64_t groups,
                                             const float* __restrict__ weight, float eps, float4 (&v)[kPerWarp]) {
  __shared__ float partial[32];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int warps = static_cast<int>(blockDim.x >> 5);
  const float4* h4 = reinterpret_cast<const float4*>(hr);
  const float4* b4 = reinterpret_cast<const float4*>(br);
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  float4 w[kPerWarp];
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int64_t g = warp + int64_t(i) * warps;
    v[i] = w[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (g < groups) {
      v[i] = h4[g * 32 + lane];
      w[i] = w4[g * 32 + lane];
      if constexpr (kAdd) {
        const float4 b = b4[g * 32 + lane];
        v[i] = make_float4(v[i].x + b.x, v[i].y + b.y, v[i].z + b.z, v[i].w + b.w);
      }
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int64_t g = warp + int64_t(i) * warps;
    if (g < groups) {
      if constexpr (kAdd) reinterpret_cast<float4*>(hr)[g * 32 + lane] = v[i];
      sum += v[i].x * v[i].x;
      sum += v[i].y * v[i].y;
      sum += v[i].z * v[i].z;
      sum += v[i].w * v[i].w;
    }
  }
  const float inv = rsqrtf(norm_block_sum(sum, partial) / static_cast<float>(groups * 128) + eps);
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i)
    v[i] = make_float4(v[i].x * inv * w[i].x, v[i].y * inv * w[i].y, v[i].z * inv * w[i].z, v[i].w * inv * w[i].w);
}

}  // namespace ninfer::cuda::kernels
