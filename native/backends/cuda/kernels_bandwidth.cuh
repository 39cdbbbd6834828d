// A read-only stream over device memory with the GEMV's weight loads: the ceiling a
// weight-streaming kernel can reach, measured the same way (a copy counts bytes read and
// written, a GEMV only reads); and the L2 prefetch that lets a decode GEMV's weights arrive
// while the small kernels before it run.
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

inline constexpr int64_t kL2PrefetchChunk = 16 * 1024;  // bytes of one bulk prefetch

// Asks L2 for up to two ranges of memory that no kernel writes (weights), one thread a
// kL2PrefetchChunk piece, and returns: the bulk prefetches complete on their own. Launched with
// programmatic serialization it runs beside the previous kernel, so it waits for that kernel
// before it exits: the next kernel's own wait covers the ones before this one.
__global__ void l2_prefetch(const uint8_t* a, int64_t a_bytes, const uint8_t* b, int64_t b_bytes) {
  allow_dependent_launch();
  const int64_t a_chunks = (a_bytes + kL2PrefetchChunk - 1) / kL2PrefetchChunk;
  const int64_t chunks = a_chunks + (b_bytes + kL2PrefetchChunk - 1) / kL2PrefetchChunk;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    const bool in_a = c < a_chunks;
    const int64_t at = (in_a ? c : c - a_chunks) * kL2PrefetchChunk;
    const int64_t end = in_a ? a_bytes : b_bytes;
    const auto bytes = static_cast<uint32_t>(min(kL2PrefetchChunk, end - at) & ~int64_t{15});
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes > 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((in_a ? a : b) + at), "r"(bytes) : "memory");
#endif
  }
  wait_for_prerequisite_grids();
}

}  // namespace ninfer::cuda::kernels
