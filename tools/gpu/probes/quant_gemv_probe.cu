// Probe: what limits the FP8 / NVFP4 decode GEMV at m = 1 on the H200?
//
// One kernel structure (the bf16 GEMV's: 8·RT-row tiles, weights as the mma B operand, warps
// interleaved over 128-k units, U units of loads in flight per warp), several ways to turn the
// codes into mma operands, timed on the 27B decode shapes against a read stream of the same
// bytes. Built and run by tools/gpu/probes/run_quant_gemv_probe.sh; the code-to-operand helpers
// are the kernels' own (kernels_gemv*.cuh) where a kernel uses the same form. FP8 lanes read
// bytes 16t and 64 + 16t of each 128-byte unit (the sector layout); the first run of
// 2026-12-02 had the older 32t, 32t + 16 (bench/RESULTS.md compares the two).
//   FP8 dequantizations:
//     0 CHAIN  e4m3x2 -> half2 -> float2 -> bf16x2 (what kernels_gemv_quant.cuh does), bf16 mma
//     1 CVT16  e4m3x2 -> f16x2 in one cvt, f16 mma (x as f16)
//     2 INTBF  bit placement into bf16 (value · 2^-120) and one bf16x2 multiply by 2^120, bf16 mma
//     3 INT16  bit placement into f16 (value · 2^-8, folded into the block scale), f16 mma
//     4 NONE   the raw bytes as f16 (timing only: no dequantization at all)
//   NVFP4 dequantizations:
//     10 PERM  byte-permute tables -> bf16, bf16x2 group-scale multiply (kernels_gemv_quant.cuh)
//     11 INT16 bit placement into f16 (value · 2^-14), f16x2 multiply by group scale · 2^7
//     12 NONE  raw words as f16 (timing only)
//     14 INTBF bit placement into bf16 (value · 2^-126), bf16x2 multiply by group scale · 2^119
//   TILED=1: the codes in groups of 8 rows stored unit-major ([row / 8][unit][row % 8][unit
//   bytes]), so that the 8 rows × 128 (FP8) or 64 (NVFP4) bytes a warp loads for one unit and
//   row tile are one contiguous stretch, where row-major storage puts them k bytes apart (is
//   the DRAM access pattern what keeps the GEMV below the read stream?). Scales stay row-major.
#include "backends/cuda/kernels_gemv_quant_sectors.cuh"
#include "backends/cuda/kernels_gemv_quant_staged.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

#ifndef DEQ
#define DEQ 0
#endif
constexpr int kDeq = DEQ;
#ifndef TILED
#define TILED 0
#endif
constexpr bool kTiled = TILED != 0;
constexpr bool kNvfp4 = kDeq >= 10;

using namespace ninfer::cuda::kernels;

__device__ __forceinline__ uint4 ldw(const uint8_t* p) { return load_ahead16(p); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { return pack_bf16x2(lo, hi); }
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <bool kF16>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  if constexpr (kF16)
    mma_m16n8k16_f16_low(d, a0, a2, b0, b1);
  else
    mma_m16n8k16_bf16(d, a0, 0u, a2, 0u, b0, b1);
}
__device__ __forceinline__ uint32_t cvt_e4m3x2_f16x2(uint32_t pair16) { return e4m3x2_to_f16x2(static_cast<uint16_t>(pair16)); }
__device__ __forceinline__ uint32_t chain_e4m3x2_bf16x2(uint16_t pair) { return e4m3x2_to_bf16x2(pair); }

// One 32-bit word of 4 e4m3 codes -> the B fragment of one mma {b0, b1}, and the physical k
// order of its x pair registers: xk[j] = which code (0..3) each of the 4 halves (b0.lo, b0.hi,
// b1.lo, b1.hi) is.
__device__ __forceinline__ void fp8_word(uint32_t q, uint32_t& b0, uint32_t& b1) {
  if constexpr (kDeq == 0) {
    b0 = chain_e4m3x2_bf16x2(static_cast<uint16_t>(q));
    b1 = chain_e4m3x2_bf16x2(static_cast<uint16_t>(q >> 16));
  } else if constexpr (kDeq == 1) {
    b0 = cvt_e4m3x2_f16x2(q);
    b1 = cvt_e4m3x2_f16x2(q >> 16);
  } else if constexpr (kDeq == 2) {
    e4m3x4_to_bf16_by_bits(q, b0, b1);  // the sector kernel's: bytes 0, 2 -> b0; 1, 3 -> b1
  } else if constexpr (kDeq == 3) {
    // bytes 0, 2 -> b0 (f16 bits s at 15, eeee mmm at 13..7), bytes 1, 3 -> b1; value · 2^-8.
    b0 = ((q << 8) & 0x80008000u) | ((q << 7) & 0x3F803F80u);
    b1 = (q & 0x80008000u) | ((q >> 1) & 0x3F803F80u);
  } else {
    b0 = q;
    b1 = q ^ 0x01000100u;
  }
}
// x at the 4 physical k of a word, as the A registers {a0, a2} matching fp8_word's order.
template <bool kF16>
__device__ __forceinline__ void fp8_x(const float4 x, uint32_t& a0, uint32_t& a2) {
  constexpr bool kOddEven = kDeq == 2 || kDeq == 3;  // b0 = codes 0, 2; b1 = codes 1, 3
  const float l0 = x.x, l1 = kOddEven ? x.z : x.y, h0 = kOddEven ? x.y : x.z, h1 = x.w;
  if constexpr (kF16) {
    a0 = pack_f16(l0, l1);
    a2 = pack_f16(h0, h1);
  } else {
    a0 = pack_bf16(l0, l1);
    a2 = pack_bf16(h0, h1);
  }
}

// NVFP4: one word of 8 e2m1 codes -> two mmas' B fragments {b[0], b[1]}, {b[2], b[3]}, with
// the group scale applied; order: codes (0,4) (1,5) | (2,6) (3,7) for INT16, (0,1) (2,3) |
// (4,5) (6,7) for PERM.
__device__ __forceinline__ void e2m1_word(uint32_t w, uint32_t scale2, uint32_t (&b)[4]) {
  if constexpr (kDeq == 10) {
    const uint4 v = e2m1x8_to_bf16(w);  // the general kernel's byte-permute tables
    b[0] = bf16x2_mul(v.x, scale2), b[1] = bf16x2_mul(v.y, scale2);
    b[2] = bf16x2_mul(v.z, scale2), b[3] = bf16x2_mul(v.w, scale2);
  } else if constexpr (kDeq == 11) {
    b[0] = f16x2_mul(((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u), scale2);
    b[1] = f16x2_mul(((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u), scale2);
    b[2] = f16x2_mul(((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u), scale2);
    b[3] = f16x2_mul(((w >> 3) & 0x0E000E00u) | (w & 0x80008000u), scale2);
  } else if constexpr (kDeq == 14) {
    e2m1x8_to_bf16_by_bits(w, scale2, b);  // the sector kernel's
  } else {
    b[0] = w;
    b[1] = w ^ 1u;
    b[2] = w ^ 2u;
    b[3] = w ^ 3u;
  }
}
constexpr bool kF16Mma = kDeq == 1 || kDeq == 3 || kDeq == 4 || kDeq == 11 || kDeq == 12;

// The group scale (e4m3) as the multiplier of e2m1_word, in both halves.
__device__ __forceinline__ uint32_t group_scale2(uint8_t s) {
  if constexpr (kDeq == 10) {
    return e4m3_to_bf16x2_splat(s);
  } else if constexpr (kDeq == 14) {
    uint32_t first, second;
    group_scales_bf16_2p119(s, first, second);
    return first;
  } else {
    const uint32_t h = cvt_e4m3x2_f16x2(s | (s << 8));
    return f16x2_mul(h, 0x58005800u);  // · 2^7 (f16 128)
  }
}

template <int RT, int W, int U>
__global__ void __launch_bounds__(32 * W) gemv(const uint8_t* __restrict__ codes, const void* __restrict__ scales,
                                               const float* __restrict__ x, float* __restrict__ y, int n, int k) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 8 * RT;
  const int units = k / 128;
  const int64_t stride = kNvfp4 ? k / 2 : k;
  const uint8_t* wl[RT];
  constexpr int kUnitBytes = kNvfp4 ? 64 : 128;
#pragma unroll
  for (int r = 0; r < RT; ++r)
    wl[r] = kTiled ? codes + (int64_t(row0 / 8 + r) * units * 8 + g) * kUnitBytes + 16 * t
                   : codes + int64_t(row0 + 8 * r + g) * stride + 16 * t;
  float acc[RT][4] = {};
  const bool xlive = g == 0;
  for (int u0 = warp; u0 < units; u0 += W * U) {
    uint4 raw[U][RT][kNvfp4 ? 1 : 2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int unit = min(u0 + u * W, units - 1);
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const uint8_t* p = wl[r] + int64_t(unit) * (kTiled ? 8 * kUnitBytes : kUnitBytes);
        raw[u][r][0] = ldw(p);
        if constexpr (!kNvfp4) raw[u][r][1] = ldw(p + 64);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int unit = u0 + u * W;
      if (unit >= units) break;
      const float* xp = x + unit * 128 + (kNvfp4 ? 32 : 16) * t;
      if constexpr (!kNvfp4) {
        float part[RT][4] = {};
#pragma unroll
        for (int wd = 0; wd < 8; ++wd) {  // 8 words of 4 codes: this lane's 32 k of the unit
          uint32_t a0 = 0, a2 = 0;
          if (xlive) fp8_x<kF16Mma>(__ldg(reinterpret_cast<const float4*>(xp + (wd / 4) * 64) + (wd & 3)), a0, a2);
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            const uint4& v = raw[u][r][wd / 4];
            const uint32_t q = (wd & 3) == 0 ? v.x : (wd & 3) == 1 ? v.y : (wd & 3) == 2 ? v.z : v.w;
            uint32_t b0, b1;
            fp8_word(q, b0, b1);
            mma<kF16Mma>(part[r], a0, a2, b0, b1);
          }
        }
        // All RT·8 rows of a tile share one 128-row scale block.
        const float s = __ldg(static_cast<const float*>(scales) + (row0 / 128) * units + unit) *
                        (kDeq == 3 ? 256.0f : 1.0f);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[r][i] += part[r][i] * s;
      } else {
        uint32_t gs[RT][2];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const uint8_t* sp = static_cast<const uint8_t*>(scales) + int64_t(row0 + 8 * r + g) * (k / 16) + unit * 8 + 2 * t;
          const uint16_t both = __ldg(reinterpret_cast<const unsigned short*>(sp));
          gs[r][0] = group_scale2(static_cast<uint8_t>(both));
          gs[r][1] = group_scale2(static_cast<uint8_t>(both >> 8));
        }
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) {  // 4 words of 8 codes
          uint32_t a[4] = {0, 0, 0, 0};
          if (xlive) {
            const float4 xa = __ldg(reinterpret_cast<const float4*>(xp + 8 * wd));
            const float4 xb = __ldg(reinterpret_cast<const float4*>(xp + 8 * wd + 4));
            if constexpr (kDeq == 10) {
              a[0] = pack_bf16(xa.x, xa.y), a[1] = pack_bf16(xa.z, xa.w);
              a[2] = pack_bf16(xb.x, xb.y), a[3] = pack_bf16(xb.z, xb.w);
            } else if constexpr (kDeq == 14) {
              a[0] = pack_bf16(xa.x, xb.x), a[1] = pack_bf16(xa.y, xb.y);
              a[2] = pack_bf16(xa.z, xb.z), a[3] = pack_bf16(xa.w, xb.w);
            } else {
              a[0] = pack_f16(xa.x, xb.x), a[1] = pack_f16(xa.y, xb.y);
              a[2] = pack_f16(xa.z, xb.z), a[3] = pack_f16(xa.w, xb.w);
            }
          }
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            const uint4& v = raw[u][r][0];
            const uint32_t q = wd == 0 ? v.x : wd == 1 ? v.y : wd == 2 ? v.z : v.w;
            uint32_t b[4];
            e2m1_word(q, gs[r][wd / 2], b);
            mma<kF16Mma>(acc[r], a[0], a[1], b[0], b[1]);
            mma<kF16Mma>(acc[r], a[2], a[3], b[2], b[3]);
          }
        }
      }
    }
  }
  __shared__ float part[W][RT * 8];
  if (g == 0)
#pragma unroll
    for (int r = 0; r < RT; ++r) part[warp][8 * r + 2 * t] = acc[r][0], part[warp][8 * r + 2 * t + 1] = acc[r][1];
  __syncthreads();
  for (int i = threadIdx.x; i < RT * 8; i += 32 * W) {
    float s = 0;
    for (int w = 0; w < W; ++w) s += part[w][i];
    if constexpr (kNvfp4) s *= (kDeq == 11 || kDeq == 14 ? 128.0f : 1.0f);  // f16 values · 2^-14 · 2^7
    y[row0 + i] = s;
  }
}

__global__ void read_stream(const uint4* __restrict__ p, int64_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = ldw(reinterpret_cast<const uint8_t*>(p + i)), b = ldw(reinterpret_cast<const uint8_t*>(p + i + stride));
    uint4 c = ldw(reinterpret_cast<const uint8_t*>(p + i + 2 * stride)),
          d = ldw(reinterpret_cast<const uint8_t*>(p + i + 3 * stride));
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    uint4 a = ldw(reinterpret_cast<const uint8_t*>(p + i));
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Host reference values of the formats.
static float e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
static float e2m1_value(uint8_t c) {
  static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

struct Shape {
  const char* name;
  int n, k;
};

using Kernel = void (*)(const uint8_t*, const void*, const float*, float*, int, int);
struct Variant {
  const char* name;
  Kernel kernel;
  int rt, w;
};

int main() {
  const Shape shapes[] = {{"in_proj 16384x5120", 16384, 5120},
                          {"gate_up 34816x5120", 34816, 5120},
                          {"down 5120x17408", 5120, 17408},
                          {"out_proj 5120x6144", 5120, 6144}};
  const Variant variants[] = {
      {"rt2 w4 u2", gemv<2, 4, 2>, 2, 4}, {"rt2 w4 u4", gemv<2, 4, 4>, 2, 4}, {"rt4 w4 u2", gemv<4, 4, 2>, 4, 4},
      {"rt1 w4 u4", gemv<1, 4, 4>, 1, 4}, {"rt2 w8 u2", gemv<2, 8, 2>, 2, 8}, {"rt4 w8 u1", gemv<4, 8, 1>, 4, 8},
      {"rt1 w8 u4", gemv<1, 8, 4>, 1, 8}, {"rt2 w4 u8", gemv<2, 4, 8>, 2, 4},
  };
  constexpr int kCopies = 6;
  const int64_t max_bytes = int64_t(34816) * 5120;
  uint8_t* pool;
  CK(cudaMalloc(&pool, max_bytes * kCopies));
  void* scale_pool;
  CK(cudaMalloc(&scale_pool, int64_t(34816) * 17408 / 16 * kCopies + 4096));
  float *x, *y;
  CK(cudaMalloc(&x, 17408 * sizeof(float)));
  CK(cudaMalloc(&y, 34816 * sizeof(float)));
  uint32_t* sink;
  CK(cudaMalloc(&sink, 4));
  std::mt19937 rng(1234);

  // Copy rate, as the benchmarks measure it: device-to-device copy of 1 GiB, read + write.
  {
    const int64_t bytes = int64_t(1) << 29;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int i = 0; i < 12; ++i) {
      CK(cudaEventRecord(e0));
      CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    std::printf("copy rate %.3f TB/s (512 MiB D2D, read+write, median of 12)\n", 2.0 * bytes / (ts[6] * 1e-3) / 1e12);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));
  // Mean per launch over 24 back-to-back launches (each on the next copy), median of 5 batches.
  auto time_launches = [&](auto&& launch) {
    for (int i = 0; i < 3; ++i) launch(i);
    CK(cudaDeviceSynchronize());
    std::vector<float> ts;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cudaEventRecord(ev[0]));
      for (int i = 0; i < 24; ++i) launch(i);
      CK(cudaEventRecord(ev[1]));
      CK(cudaEventSynchronize(ev[1]));
      float ms;
      CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      ts.push_back(ms * 1000.0f / 24);
    }
    CK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  };

  for (const Shape& sh : shapes) {
    const int64_t code_bytes = kNvfp4 ? int64_t(sh.n) * sh.k / 2 : int64_t(sh.n) * sh.k;
    const int64_t scale_bytes =
        kNvfp4 ? int64_t(sh.n) * sh.k / 16 : int64_t(sh.n / 128) * (sh.k / 128) * int64_t(sizeof(float));
    // Random codes (no NaN: e4m3 0x7F/0xFF avoided), positive group scales, fp8 block scales.
    std::vector<uint8_t> codes(code_bytes), sc(scale_bytes);
    for (auto& c : codes) {
      uint8_t v = static_cast<uint8_t>(rng());
      if (!kNvfp4 && (v & 0x7F) == 0x7F) v ^= 1;
      c = v;
    }
    if (kNvfp4) {
      for (auto& s : sc) s = static_cast<uint8_t>(0x20 + rng() % 0x30);  // 2^-3 .. 2^2
    } else {
      float* f = reinterpret_cast<float*>(sc.data());
      for (int64_t i = 0; i < scale_bytes / 4; ++i) f[i] = std::ldexp(1.0f + (rng() % 100) / 100.0f, -8);
    }
    std::vector<uint8_t> stored = codes;  // as the kernel reads them (TILED: 8-row groups unit-major)
    if (kTiled) {
      const int64_t unit_bytes = kNvfp4 ? 64 : 128, row_bytes = kNvfp4 ? sh.k / 2 : sh.k, units = sh.k / 128;
      for (int64_t r = 0; r < sh.n; ++r)
        for (int64_t u = 0; u < units; ++u)
          std::memcpy(&stored[((r / 8 * units + u) * 8 + r % 8) * unit_bytes], &codes[r * row_bytes + u * unit_bytes],
                      unit_bytes);
    }
    for (int c = 0; c < kCopies; ++c) {
      CK(cudaMemcpy(pool + c * max_bytes, stored.data(), code_bytes, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(static_cast<uint8_t*>(scale_pool) + c * (int64_t(34816) * 17408 / 16), sc.data(), scale_bytes,
                    cudaMemcpyHostToDevice));
    }
    std::vector<float> xs(sh.k);
    for (auto& v : xs) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    CK(cudaMemcpy(x, xs.data(), sh.k * 4, cudaMemcpyHostToDevice));
    // Reference rows: the first 64 and the last 64, f64 over the decoded values; x rounded as
    // the kernel rounds it (bf16 or f16).
    std::vector<int> check_rows;
    for (int r = 0; r < 64; ++r) check_rows.push_back(r), check_rows.push_back(sh.n - 1 - r);
    std::vector<double> ref(check_rows.size());
    for (size_t i = 0; i < check_rows.size(); ++i) {
      const int r = check_rows[i];
      double s = 0;
      for (int c = 0; c < sh.k; ++c) {
        const float xr = kF16Mma ? __half2float(__float2half_rn(xs[c])) : __bfloat162float(__float2bfloat16_rn(xs[c]));
        double wv;
        if (kNvfp4) {
          const uint8_t byte = codes[int64_t(r) * sh.k / 2 + c / 2];
          wv = double(e2m1_value(c & 1 ? byte >> 4 : byte & 15)) *
               e4m3_value(sc[int64_t(r) * (sh.k / 16) + c / 16]);
        } else {
          wv = double(e4m3_value(codes[int64_t(r) * sh.k + c])) *
               reinterpret_cast<const float*>(sc.data())[(r / 128) * (sh.k / 128) + c / 128];
        }
        s += wv * xr;
      }
      ref[i] = s;
    }
    const float stream_us = time_launches([&](int i) {
      read_stream<<<132 * 8, 512>>>(reinterpret_cast<const uint4*>(pool + (i % kCopies) * max_bytes), code_bytes / 16,
                                    sink);
    });
    const double bytes = double(code_bytes + scale_bytes);
    std::printf("DEQ %d%s | %s | %.1f MB | read stream %.1f us (%.2f TB/s)\n", kDeq, kTiled ? " tiled" : "", sh.name, bytes / 1e6, stream_us,
                code_bytes / (stream_us * 1e-6) / 1e12);
    for (const Variant& v : variants) {
      if (sh.n % (8 * v.rt)) continue;
      const int blocks = sh.n / (8 * v.rt);
      const float us = time_launches([&](int i) {
        v.kernel<<<blocks, 32 * v.w>>>(pool + (i % kCopies) * max_bytes,
                                       static_cast<uint8_t*>(scale_pool) + (i % kCopies) * (int64_t(34816) * 17408 / 16),
                                       x, y, sh.n, sh.k);
      });
      std::vector<float> got(sh.n);
      CK(cudaMemcpy(got.data(), y, sh.n * 4, cudaMemcpyDeviceToHost));
      double worst = 0, scale = 0;
      for (size_t i = 0; i < check_rows.size(); ++i) scale = std::max(scale, std::fabs(ref[i]));
      for (size_t i = 0; i < check_rows.size(); ++i)
        worst = std::max(worst, std::fabs(got[check_rows[i]] - ref[i]) / scale);
      std::printf("DEQ %d%s | %s | %s | %.1f us | %.2f TB/s | %.1f%% of stream | max err/max|y| %.2e\n", kDeq,
                  kTiled ? " tiled" : "", sh.name,
                  v.name, us, bytes / (us * 1e-6) / 1e12, 100.0 * stream_us / us * bytes / code_bytes, worst);
    }
  }
  return 0;
}
