// Warp-level tensor-core and async-copy primitives (PTX) shared by the hand attention, GEMM
// and GDN chunk kernels: mma.sync (bf16 m16n8k16 and tf32 m16n8k8, f32 accumulation),
// ldmatrix, cp.async, and the fast exp2. Fragment layouts are the PTX ISA's; for a lane,
// g = lane / 4 and t = lane % 4:
//   bf16 A (16x16, row-major)  a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   bf16 B (16x8,  k x n)      b0: (k 2t..2t+1, n g)  b1: (k 2t+8..2t+9, n g)
//   tf32 A (16x8)              a0: (g, t)  a1: (g+8, t)  a2: (g, t+4)  a3: (g+8, t+4)
//   tf32 B (8x8)               b0: (t, g)  b1: (t+4, g)
//   C (16x8, f32)              c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)
// The plain-register fragment readers (load_a, load_b, ...) take tiles whose row pitches are
// chosen per use so that a warp's 32 reads hit 32 different banks (pitch = 4 mod 32 floats
// when a fragment walks rows by g, 8 mod 32 when by t).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels_common.cuh"  // shared_address, cp_async_16/commit/wait, pack_bf16x2

namespace ninfer::cuda {

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

// The same with a generic shared-memory pointer: always copies, or copies iff `copy`.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) { cp_async_16(shared_address(smem), gmem, true); }
__device__ __forceinline__ void cp_async_16_or_zero(void* smem, const void* gmem, bool copy) {
  cp_async_16(shared_address(smem), gmem, copy);
}

// --- tf32 and bf16 fragments read from plain shared-memory tiles -----------------------------


// Round to nearest (ties away) to tf32, the form the tensor cores read (10 mantissa bits).
__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float round_tf32(float x) { return __uint_as_float(tf32_bits(x)); }

// d += a b for one 16x8x8 tile.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Fragment readers: `x` points at the tile's (0, 0) element. kRound: the values are raw fp32
// (rounded here); otherwise they were stored already rounded to tf32.
template <bool kRound>
__device__ __forceinline__ uint32_t tf32_operand(float v) {
  if constexpr (kRound)
    return tf32_bits(v);
  else
    return __float_as_uint(v);
}

// A from a row-major [m][k] tile.
template <bool kRound>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const float* x, int pitch, int g, int t) {
  a[0] = tf32_operand<kRound>(x[g * pitch + t]);
  a[1] = tf32_operand<kRound>(x[(g + 8) * pitch + t]);
  a[2] = tf32_operand<kRound>(x[g * pitch + t + 4]);
  a[3] = tf32_operand<kRound>(x[(g + 8) * pitch + t + 4]);
}

// A from a [k][m] tile (the transpose of a row-major one).
template <bool kRound>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const float* x, int pitch, int g, int t) {
  a[0] = tf32_operand<kRound>(x[t * pitch + g]);
  a[1] = tf32_operand<kRound>(x[t * pitch + g + 8]);
  a[2] = tf32_operand<kRound>(x[(t + 4) * pitch + g]);
  a[3] = tf32_operand<kRound>(x[(t + 4) * pitch + g + 8]);
}

// B from a row-major [k][n] tile.
template <bool kRound>
__device__ __forceinline__ void load_b(uint32_t (&b)[2], const float* x, int pitch, int g, int t) {
  b[0] = tf32_operand<kRound>(x[t * pitch + g]);
  b[1] = tf32_operand<kRound>(x[(t + 4) * pitch + g]);
}

// B from an [n][k] tile (B = xᵀ for a row-major x).
template <bool kRound>
__device__ __forceinline__ void load_b_transposed(uint32_t (&b)[2], const float* x, int pitch, int g, int t) {
  b[0] = tf32_operand<kRound>(x[g * pitch + t]);
  b[1] = tf32_operand<kRound>(x[g * pitch + t + 4]);
}

// d += a b for one 16x8x16 bf16 tile.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats as a bf16 pair (round to nearest even), `lo` in the low half: the lower k index of
// a fragment register.
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// bf16 fragment readers; `x` points at the tile's (0, 0) element, pitch in elements (a pitch of
// 8 mod 64 elements keeps a warp's reads on 32 different banks).
// A from a row-major [m][k] tile.
__device__ __forceinline__ void load_a_bf16(uint32_t (&a)[4], const __nv_bfloat16* x, int pitch, int g, int t) {
  a[0] = *reinterpret_cast<const uint32_t*>(x + g * pitch + 2 * t);
  a[1] = *reinterpret_cast<const uint32_t*>(x + (g + 8) * pitch + 2 * t);
  a[2] = *reinterpret_cast<const uint32_t*>(x + g * pitch + 2 * t + 8);
  a[3] = *reinterpret_cast<const uint32_t*>(x + (g + 8) * pitch + 2 * t + 8);
}
// B from an [n][k] tile.
__device__ __forceinline__ void load_b_bf16(uint32_t (&b)[2], const __nv_bfloat16* x, int pitch, int g, int t) {
  b[0] = *reinterpret_cast<const uint32_t*>(x + g * pitch + 2 * t);
  b[1] = *reinterpret_cast<const uint32_t*>(x + g * pitch + 2 * t + 8);
}

// 16 bytes global -> shared, asynchronously; zeros instead when !valid (src is not read then,
// but must still be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// Waits for all of this thread's copies; a barrier must follow before others read them.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

}  // namespace ninfer::cuda
