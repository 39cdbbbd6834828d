// Warp-level tensor-core and async-copy primitives (PTX): mma.sync m16n8k16 bf16 -> f32,
// ldmatrix, cp.async, and the fast exp2, shared by the hand attention and GEMM kernels. Fragment layouts are the PTX ISA's: for a lane,
// g = lane / 4 and t = lane % 4;
//   A (16x16, row-major)  a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16x8,  k x n)      b0: (k 2t..2t+1, n g)  b1: (k 2t+8..2t+9, n g)
//   C (16x8, f32)         c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace ninfer::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { ldmatrix_x4(r, shared_address(smem)); }

// As ldmatrix_x4, each matrix transposed (rows of the stored matrix become fragment columns).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a · b on a 16x8x16 tile, bf16 operands, f32 accumulation. Registers only, so not
// volatile (the compiler may schedule it); ldmatrix and cp.async stay volatile so that they
// keep their places relative to the barriers.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte global -> shared copy that bypasses registers; with fill == false the destination
// is zeroed and nothing is read.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool fill) {
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The same with a generic shared-memory pointer: always copies, or copies iff `copy`.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) { cp_async_16(shared_address(smem), gmem, true); }
__device__ __forceinline__ void cp_async_16_or_zero(void* smem, const void* gmem, bool copy) {
  cp_async_16(shared_address(smem), gmem, copy);
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
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 2^x on the special-function unit (relative error ~2^-22; -inf -> 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ninfer::cuda
