// Small device helpers shared by the kernel headers.
#pragma once

#include <cfloat>
#include <climits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda {

// Unpacks 8 bf16 values held in a 16-byte vector into floats.
__device__ __forceinline__ void bf16x8_to_float(const uint4& packed, float (&out)[8]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// A warp's router softmax before top-k: p[i] (the logit of expert lane + 32·i, -FLT_MAX past
// `experts`) becomes exp(p - max) (-1 past `experts`: never chosen); returns the warp's sum.
template <int PER_LANE>
__device__ __forceinline__ float warp_softmax_numerators(float (&p)[PER_LANE], int lane, int experts) {
  float mx = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) mx = fmaxf(mx, p[i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    p[i] = lane + 32 * i < experts ? expf(p[i] - mx) : -1.0f;  // -1: never chosen
    sum += fmaxf(p[i], 0.0f);
  }
  return warp_sum(sum);
}

// One step of a warp's top-k over the values p[i] of lane + 32·i (non-negative where they
// may be chosen): the largest remaining value and its id, the lower id on ties, which is then
// marked taken (-1) in its lane.
template <int PER_LANE>
__device__ __forceinline__ void warp_take_largest(float (&p)[PER_LANE], int lane, float& best, int& best_id) {
  best = -2.0f;
  best_id = INT_MAX;
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
}

// Programmatic dependent launch (sm_90). A kernel that calls allow_dependent_launch() lets the
// next kernel of the stream start early if that one was launched with programmatic stream
// serialization; such a kernel must call wait_for_prerequisite_grids() before it touches
// anything an earlier kernel writes or reads (the wait returns once those kernels completed
// and their memory is visible). Both are no-ops for kernels launched the ordinary way.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Four floats of memory that an earlier kernel of the stream writes (activations, not
// weights), for kernels that may start early: a coherent ld.global. The non-coherent path
// (__ldg, or a load through a const __restrict__ pointer: ld.global.nc) promises memory that
// nothing writes while the kernel runs, so ptxas may issue such a load above
// wait_for_prerequisite_grids() — the stream-K GEMV read x before its previous kernel had
// written it (2026-12-03; tools/pdl_sass_audit.py lists loads placed above a kernel's wait).
// Volatile, so that the compiler keeps it below the wait too.
__device__ __forceinline__ float4 load_activations4(const float* p) {
  float4 v;
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// Shared-memory address of a generic pointer into shared memory (for PTX operands).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses registers; with fill == false the destination
// is zeroed and nothing is read.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool fill) {
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `pending` of this thread's committed copy groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

// Two floats as packed bf16 (the first in the low half, as fragments expect).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// 2^x on the special-function unit (relative error ~2^-22; -inf -> 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

inline unsigned int blocks_for(int64_t n, int threads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

}  // namespace ninfer::cuda
