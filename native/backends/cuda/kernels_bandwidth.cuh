// A read-only stream over device memory with the GEMV's weight loads: the ceiling a
// weight-streaming kernel can reach, measured the same way (a copy counts bytes read and
// written, a GEMV only reads).
#pragma once

#include "backends/cuda/kernels_gemv.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kReadStreamUnroll = 8;

// Each thread XORs kReadStreamUnroll independent 16-byte loads per step of a grid-stride loop
// and writes its result only if it equals a value random data never gives, so the loads are
// kept but nothing is stored.
__global__ void read_stream(const uint4* __restrict__ data, int64_t count, uint32_t* __restrict__ sink) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + (kReadStreamUnroll - 1) * stride < count; i += kReadStreamUnroll * stride) {
    uint4 v[kReadStreamUnroll];
#pragma unroll
    for (int u = 0; u < kReadStreamUnroll; ++u)
      v[u] = load_weights16(reinterpret_cast<const uint16_t*>(data + i + u * stride));
#pragma unroll
    for (int u = 0; u < kReadStreamUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < count; i += stride) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

}  // namespace ninfer::cuda::kernels
