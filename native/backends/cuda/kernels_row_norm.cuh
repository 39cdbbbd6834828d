// The per-row RMSNorm of one warp (inline device code only, so that any kernel file can
// include it): used by kernels_hybrid.cuh's row_norm_warps and by the FP8 prefill producer
// that quantizes the GDN output's gated norm (kernels_fp8_prefill.cuh).
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

}  // namespace ninfer::cuda::kernels
