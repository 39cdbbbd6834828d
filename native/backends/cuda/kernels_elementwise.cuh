// Memory-bound kernels over float32 activations: conversion, embedding, RMSNorm, RoPE,
// SwiGLU, residual add, row gather, bias add and seeded random fills.
#pragma once

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_row_norm.cuh"

namespace ninfer::cuda::kernels {

__global__ void f32_to_bf16(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = float_to_bf16_bits(x[i]);
}

// splitmix64 of (seed, index): a counter-based generator, so any element can be made alone.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void random_bf16(uint16_t* __restrict__ w, int64_t n, uint64_t seed, float scale) {
  const uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(key ^ static_cast<uint64_t>(i));
    const float unit = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    w[i] = float_to_bf16_bits((2.0f * unit - 1.0f) * scale);
  }
}

__global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias, int64_t m, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += bias[i % n];
}

// One block per token row.
__global__ void embedding(const uint16_t* __restrict__ table, int64_t cols, const int32_t* __restrict__ tokens,
                          float* __restrict__ out) {
  const uint16_t* src = table + static_cast<int64_t>(tokens[blockIdx.x]) * cols;
  float* dst = out + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = bf16_bits_to_float(src[c]);
}

// One block per row: h += branch, then y = rms_norm(h) (the residual add and the next layer's
// norm in one pass). With kPerThread > 0 (cols <= kPerThread * blockDim.x) every load of the
// row (h, branch, weight) is issued before the first store, so the kernel pays one memory
// latency instead of one per strided step (at batch 1 these kernels are latency-bound);
// kPerThread = 0 loops over any width. Either way, the same float operations in the same
// order as rms_norm (below) with the same block size. Rows of whole 128-column groups take
// vec_rms_norm instead (launch_per_row.h).
template <int kPerThread>
__global__ void __launch_bounds__(1024) add_rms_norm(float* h, const float* __restrict__ branch, int64_t cols,
                             const float* __restrict__ weight, float eps, float* __restrict__ y) {
  allow_dependent_launch();  // the next GEMV may start streaming its weights
  wait_for_prerequisite_grids();
  float* hr = h + static_cast<int64_t>(blockIdx.x) * cols;
  const float* br = branch + static_cast<int64_t>(blockIdx.x) * cols;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * cols;
  __shared__ float partial[32];
  float sum = 0.0f;
  if constexpr (kPerThread > 0) {
    float v[kPerThread], w[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      v[i] = c < cols ? hr[c] + br[c] : 0.0f;
      w[i] = c < cols ? weight[c] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      if (c < cols) {
        hr[c] = v[i];
        sum += v[i] * v[i];
      }
    }
    const float inv = rsqrtf(norm_block_sum(sum, partial) / static_cast<float>(cols) + eps);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      if (c < cols) yr[c] = v[i] * inv * w[i];
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = hr[c] + br[c];
      hr[c] = v;
      sum += v * v;
    }
    const float inv = rsqrtf(norm_block_sum(sum, partial) / static_cast<float>(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = hr[c] * inv * weight[c];
  }
}

// rms_norm (kAdd: add_rms_norm) of rows of 128-column groups, one block a row, through
// vec_norm_row (x may equal y: every load comes before the first store).
template <int kPerWarp, bool kAdd>
__global__ void __launch_bounds__(kVecNormThreads) vec_rms_norm(float* h, const float* __restrict__ branch, int64_t cols,
                                                     const float* __restrict__ weight, float eps, float* y) {
  allow_dependent_launch();  // the next GEMV may start streaming its weights
  wait_for_prerequisite_grids();
  const int64_t r = blockIdx.x, groups = cols / 128;
  float4 v[kPerWarp];
  vec_norm_row<kPerWarp, kAdd>(h + r * cols, kAdd ? branch + r * cols : nullptr, groups, weight, eps, v);
  float4* yr = reinterpret_cast<float4*>(y + r * cols);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int64_t g = warp + int64_t(i) * (blockDim.x >> 5);
    if (g < groups) yr[g * 32 + lane] = v[i];
  }
}

// One block per row; the block reduces the sum of squares through shared memory. kPerThread
// as for add_rms_norm (x may equal y: every load comes before the first store).
template <int kPerThread>
__global__ void __launch_bounds__(1024)
    rms_norm(const float* x, int64_t cols, const float* __restrict__ weight, float eps, float* y) {
  allow_dependent_launch();
  wait_for_prerequisite_grids();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * cols;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * cols;
  __shared__ float partial[32];
  float sum = 0.0f;
  if constexpr (kPerThread > 0) {
    float v[kPerThread], w[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      v[i] = c < cols ? xr[c] : 0.0f;
      w[i] = c < cols ? weight[c] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) sum += v[i] * v[i];  // zeros past cols add nothing
    const float inv = rsqrtf(norm_block_sum(sum, partial) / static_cast<float>(cols) + eps);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      if (c < cols) yr[c] = v[i] * inv * w[i];
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c] * xr[c];
    const float inv = rsqrtf(norm_block_sum(sum, partial) / static_cast<float>(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = xr[c] * inv * weight[c];
  }
}

// One block per token; threads cover (head, i < rotary_dim / 2) pairs (HF rotate_half).
__global__ void rope(float* x, int64_t heads, int64_t head_dim, int64_t half, const int32_t* __restrict__ positions,
                     const float* __restrict__ inv_freq, float attention_factor) {
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    const float angle = pos * inv_freq[i];  // rounded to float32 as Hugging Face computes it
    float s, c;
    sincosf(angle, &s, &c);
    c *= attention_factor;
    s *= attention_factor;
    float* v = x + (t * heads + h) * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

__global__ void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  allow_dependent_launch();
  wait_for_prerequisite_grids();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// One block per gathered row.
__global__ void gather_rows(const float* __restrict__ src, int64_t cols, const int32_t* __restrict__ rows,
                            float* __restrict__ dst) {
  const float* s = src + static_cast<int64_t>(rows[blockIdx.x]) * cols;
  float* d = dst + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

}  // namespace ninfer::cuda::kernels
