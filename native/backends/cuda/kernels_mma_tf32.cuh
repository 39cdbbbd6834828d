// Warp-level tf32 tensor-core products (mma.sync m16n8k8, fp32 accumulation) on fp32 tiles in
// shared memory, and cp.async copies into shared memory. Fragment layouts (PTX ISA, "Matrix
// fragments for mma.m16n8k8" with .tf32), g = lane / 4, t = lane % 4:
//   A 16x8:  a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
//   B 8x8:   b0 (t, g)  b1 (t+4, g)
//   C 16x8:  c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)
// Row pitches of the tiles are chosen per use so that a warp's 32 fragment reads hit 32
// different banks (pitch = 4 mod 32 floats when a fragment walks rows by g, 8 mod 32 when by t).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda::kernels {

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

// 16 bytes global -> shared, asynchronously; zeros instead when !valid (src is not read then,
// but must still be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for all of this thread's copies; a barrier must follow before others read them.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

}  // namespace ninfer::cuda::kernels
