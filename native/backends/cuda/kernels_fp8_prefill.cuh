// FP8 prefill kernels (launchers_fp8_prefill.h): per-token activation quantization for the
// block-scaled cuBLASLt GEMM and the re-quantization of a bf16 weight into 128×128 FP8 blocks.
//
// Rounding follows the converter exactly (IEEE f32 division, e4m3 round-to-nearest-even with
// saturation), so a numpy reference reproduces the codes bit for bit.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_row_norm.cuh"
#include "backends/cuda/launchers_fp8_prefill.h"

namespace ninfer::cuda::kernels {

inline constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float fp8_group_scale(float amax) {
  return amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
}

// Four values as four e4m3 codes (the first in the lowest byte), v / s each.
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d, float s) {
  const __nv_fp8x2_storage_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(a, s), __fdiv_rn(b, s)), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(c, s), __fdiv_rn(d, s)), __NV_SATFINITE, __NV_E4M3);
  const uint32_t codes = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  // -0 (0x80, from a tiny negative value) as +0, the converter's code for zero
  return codes & ~(__vcmpeq4(codes, 0x80808080u) & 0x80808080u);
}

// One warp's (row r, 128-column group g): lane l holds columns 4l..4l+3 of the group in v.
// Every producer of FP8 GEMM activations stores through this, so a fused producer writes the
// codes and scales the quantizer would write for its f32 output, bit for bit.
__device__ __forceinline__ void store_fp8_group(const Fp8ActivationSink& sink, int64_t r, int64_t g, int lane,
                                                float4 v) {
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const float s = fp8_group_scale(amax);
  reinterpret_cast<uint32_t*>(sink.codes + r * sink.k + g * 128)[lane] = e4m3x4(v.x, v.y, v.z, v.w, s);
  if (lane == 0) {
    if (r < sink.ld) sink.scales[g * sink.ld + r] = s;
    if (sink.tail_first >= 0 && r >= sink.tail_first)
      sink.tail_scales[g * (sink.m - sink.tail_first) + (r - sink.tail_first)] = s;
  }
}

// One warp per (row, 128-column group): each lane quantizes 4 consecutive values.
__global__ void quantize_fp8_activations(const float* __restrict__ x, const Fp8ActivationSink sink) {
  const int64_t groups = sink.k / 128;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (warp >= sink.m * groups) return;
  const int64_t r = warp / groups, g = warp % groups;
  store_fp8_group(sink, r, g, lane, reinterpret_cast<const float4*>(x + r * sink.k + g * 128)[lane]);
}

// silu(gate) · up of [m, k] straight into FP8 activations, one warp per (row, 128-column group):
// each value computed as kernels_elementwise.cuh's swiglu computes it, so the codes equal
// quantize_fp8_activations of swiglu's output without that f32 [m, k] being written and read.
__global__ void swiglu_to_fp8_activations(const float* __restrict__ gate, const float* __restrict__ up,
                                          const Fp8ActivationSink sink) {
  const int64_t groups = sink.k / 128;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (warp >= sink.m * groups) return;
  const int64_t r = warp / groups, g = warp % groups, at = r * sink.k + g * 128;
  const float4 gv = reinterpret_cast<const float4*>(gate + at)[lane];
  const float4 uv = reinterpret_cast<const float4*>(up + at)[lane];
  const auto silu_times = [](float a, float b) { return a / (1.0f + expf(-a)) * b; };
  store_fp8_group(sink, r, g, lane,
                  make_float4(silu_times(gv.x, uv.x), silu_times(gv.y, uv.y), silu_times(gv.z, uv.z),
                              silu_times(gv.w, uv.w)));
}

// The GDN output's gated RMSNorm (launch_gated_rmsnorm: rows of heads × dim, dim = 128 · kVec)
// straight into the FP8 activations of the output projection: warp w takes head row w, whose
// kVec 128-column groups are groups (w % heads) · kVec + i of token row w / heads. The values are
// row_norm_warps', so the codes equal quantize_fp8_activations of launch_gated_rmsnorm's output.
template <int kVec>
__global__ void gated_rmsnorm_to_fp8_activations(const float* __restrict__ x, const float* __restrict__ z,
                                                 int64_t heads, const float* __restrict__ weight, float eps,
                                                 const Fp8ActivationSink sink) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= sink.m * heads) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  float4 y[kVec];
  row_norm_warp_values<false, true, kVec>(x + row * 128 * kVec, z + row * 128 * kVec, weight, eps, lane, y);
#pragma unroll
  for (int i = 0; i < kVec; ++i) store_fp8_group(sink, row / heads, (row % heads) * kVec + i, lane, y[i]);
}

// add_rms_norm of rows of 128-column groups (vec_rms_norm<kPerWarp, true>'s values, bit for
// bit) with y also quantized into the FP8 activations of the matmuls that follow: each warp
// holds whole groups in registers and stores them through store_fp8_group, so the codes equal
// quantize_fp8_activations of add_rms_norm's output without that pass. y_bf16 (when not null)
// gets y in bf16 too, as f32_to_bf16 rounds it, for the bf16 GEMMs of the same input (the GDN's
// small a/b projections).
template <int kPerWarp>
__global__ void __launch_bounds__(kVecNormThreads)
    add_rms_norm_to_fp8_activations(float* h, const float* __restrict__ branch, int64_t cols,
                                    const float* __restrict__ weight, float eps, float* __restrict__ y,
                                    const Fp8ActivationSink sink, uint16_t* __restrict__ y_bf16) {
  const int64_t r = blockIdx.x, groups = cols / 128;
  float4 v[kPerWarp];
  vec_norm_row<kPerWarp, true>(h + r * cols, branch + r * cols, groups, weight, eps, v);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int64_t g = warp + int64_t(i) * (blockDim.x >> 5);
    if (g >= groups) continue;  // warp-uniform: store_fp8_group reduces over the warp
    reinterpret_cast<float4*>(y + r * cols)[g * 32 + lane] = v[i];
    store_fp8_group(sink, r, g, lane, v[i]);
    if (y_bf16) {
      const uint32_t lo = float_to_bf16_bits(v[i].x) | (uint32_t(float_to_bf16_bits(v[i].y)) << 16);
      const uint32_t hi = float_to_bf16_bits(v[i].z) | (uint32_t(float_to_bf16_bits(v[i].w)) << 16);
      reinterpret_cast<uint2*>(y_bf16 + r * cols + g * 128)[lane] = make_uint2(lo, hi);
    }
  }
}

// One block of 256 threads per 128×128 block: thread t owns 64 columns of row t / 2.
__global__ void __launch_bounds__(256) requantize_bf16_to_fp8_blocks(const uint16_t* __restrict__ w, int64_t n,
                                                                     int64_t k, uint8_t* __restrict__ codes,
                                                                     float* __restrict__ scales, int64_t scale_ld) {
  __shared__ float block_max[8];
  const int64_t row = static_cast<int64_t>(blockIdx.y) * 128 + threadIdx.x / 2;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * 128 + (threadIdx.x & 1) * 64;
  float v[64];
  float amax = 0.0f;
  if (row < n) {
    const uint4* src = reinterpret_cast<const uint4*>(w + row * k + col0);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float part[8];
      bf16x8_to_float(src[i], part);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[8 * i + j] = part[j];
        amax = fmaxf(amax, fabsf(part[j]));
      }
    }
  }
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) block_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = block_max[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) amax = fmaxf(amax, block_max[i]);
  const float s = fp8_group_scale(amax);
  if (threadIdx.x == 0) scales[static_cast<int64_t>(blockIdx.y) * scale_ld + blockIdx.x] = s;
  if (row >= n) return;
  uint4* dst = reinterpret_cast<uint4*>(codes + row * k + col0);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float* q = v + 16 * i;
    dst[i] = make_uint4(e4m3x4(q[0], q[1], q[2], q[3], s), e4m3x4(q[4], q[5], q[6], q[7], s),
                        e4m3x4(q[8], q[9], q[10], q[11], s), e4m3x4(q[12], q[13], q[14], q[15], s));
  }
}

// out[c, r] = in[r, c] as f32 for an in of [rows, cols] (f32 or bf16): a GEMM whose output
// came out transposed. 32×32 tiles through shared memory, blocks of 32 × 8 threads.
template <typename T>
__global__ void transpose_to_f32(const T* __restrict__ in, int64_t rows, int64_t cols, float* __restrict__ out) {
  __shared__ float tile[32][33];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 32, r0 = static_cast<int64_t>(blockIdx.y) * 32;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      if constexpr (sizeof(T) == 2) tile[i][threadIdx.x] = bf16_bits_to_float(in[r * cols + c]);
      else tile[i][threadIdx.x] = in[r * cols + c];
    }
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][i];
  }
}

__global__ void bf16_to_f32(const uint16_t* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = bf16_bits_to_float(x[i]);
}

}  // namespace ninfer::cuda::kernels
