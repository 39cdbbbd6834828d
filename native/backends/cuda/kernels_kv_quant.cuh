// Quantized KV pages on the device (--kv-dtype fp8|int8|nvfp4; formats and region layout in
// cache/kv_format.h): the write kernel quantizes each token-head row as it is appended, and
// the attention kernels read 8 consecutive values of a row through KvRead<F>, which loads the
// codes and scales raw (so loads stay in flight while earlier keys are being worked on) and
// dequantizes at use. The codecs make the same choices as the host reference (kvcodec).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/attention_plan.h"
#include "backends/cuda/kernels_common.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kKvBf16 = 0, kKvFp8 = 1, kKvInt8 = 2, kKvNvfp4 = 3;  // KvDType values
inline constexpr int kKvRegionTokens = 64;

// First byte of region (layer, page, K|V) of a quantized pool.
__device__ __forceinline__ const uint8_t* kv_region(const KvLayout& kv, int32_t page, int which) {
  return static_cast<const uint8_t*>(kv.base) +
         ((static_cast<int64_t>(kv.layer) * kv.num_pages + page) * 2 + which) * kv.region_bytes;
}

__device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

// e2m1 (sign, 2 exponent bits, 1 mantissa bit) to float: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_to_float(uint32_t code) {
  const uint32_t e = (code >> 1) & 3, m = code & 1;
  const float v = e == 0 ? 0.5f * static_cast<float>(m) : __uint_as_float(((e + 126u) << 23) | (m << 22));
  return code & 8 ? -v : v;
}

// Nearest e2m1 code, ties to the even code, saturating at 6 (as kvcodec::float_to_e2m1).
__device__ __forceinline__ uint32_t float_to_e2m1(float x) {
  const float a = fabsf(x);
  const uint32_t c = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u : a <= 2.5f ? 4u
                   : a < 3.5f ? 5u : a <= 5.0f ? 6u : 7u;
  return (signbit(x) && c != 0 ? 8u : 0u) | c;
}

__device__ __forceinline__ uint32_t float_to_e4m3(float x) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// 8 consecutive values (elements sub*8 .. sub*8+7) of one token-head row: Raw is what a load
// brings in, to_float dequantizes it.
template <int F>
struct KvRead;

template <>
struct KvRead<kKvBf16> {
  using Raw = uint4;
  static __device__ __forceinline__ Raw zero() { return make_uint4(0, 0, 0, 0); }
  template <int HD>
  static __device__ __forceinline__ Raw load(const KvLayout& kv, int32_t page, int which, int slot, int kv_head,
                                             int sub) {
    const int64_t page_offset = ((static_cast<int64_t>(kv.layer) * kv.num_pages + page) * 2 + which) * kv.page_elems;
    return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(kv.base) + page_offset +
                                           static_cast<int64_t>(slot) * kv.num_kv_heads * HD + kv_head * HD + sub * 8);
  }
  static __device__ __forceinline__ void to_float(const Raw& r, float (&out)[8]) { bf16x8_to_float(r, out); }
};

struct KvRaw8 {
  uint2 codes;
  float scale;
};

template <>
struct KvRead<kKvFp8> {
  using Raw = KvRaw8;
  static __device__ __forceinline__ Raw zero() { return {make_uint2(0, 0), 0.0f}; }
  template <int HD>
  static __device__ __forceinline__ Raw load(const KvLayout& kv, int32_t page, int which, int slot, int kv_head,
                                             int sub) {
    const uint8_t* region = kv_region(kv, page, which);
    const int index = slot * kv.num_kv_heads + kv_head;
    return {*reinterpret_cast<const uint2*>(region + static_cast<int64_t>(index) * HD + sub * 8),
            reinterpret_cast<const float*>(region + kv.scales_offset)[index]};
  }
  static __device__ __forceinline__ void to_float(const Raw& r, float (&out)[8]) {
    const uint32_t words[2] = {r.codes.x, r.codes.y};
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const __half2_raw h2 =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * j)), __NV_E4M3);
        const float2 f = __half22float2(__half2(h2));
        out[4 * w + 2 * j] = f.x * r.scale;
        out[4 * w + 2 * j + 1] = f.y * r.scale;
      }
  }
};

template <>
struct KvRead<kKvInt8> {
  using Raw = KvRaw8;
  static __device__ __forceinline__ Raw zero() { return {make_uint2(0, 0), 0.0f}; }
  template <int HD>
  static __device__ __forceinline__ Raw load(const KvLayout& kv, int32_t page, int which, int slot, int kv_head,
                                             int sub) {
    return KvRead<kKvFp8>::load<HD>(kv, page, which, slot, kv_head, sub);  // the same layout
  }
  static __device__ __forceinline__ void to_float(const Raw& r, float (&out)[8]) {
    const uint32_t words[2] = {r.codes.x, r.codes.y};
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        out[4 * w + j] = static_cast<float>(static_cast<int8_t>((words[w] >> (8 * j)) & 0xff)) * r.scale;
  }
};

struct KvRaw4 {
  uint32_t codes;  // 8 e2m1 codes, low nibble first
  uint32_t group;  // the e4m3 scale of their 16-value group
  float scale;
};

template <>
struct KvRead<kKvNvfp4> {
  using Raw = KvRaw4;
  static __device__ __forceinline__ Raw zero() { return {0u, 0u, 0.0f}; }
  template <int HD>
  static __device__ __forceinline__ Raw load(const KvLayout& kv, int32_t page, int which, int slot, int kv_head,
                                             int sub) {
    const uint8_t* region = kv_region(kv, page, which);
    const int index = slot * kv.num_kv_heads + kv_head;
    return {*reinterpret_cast<const uint32_t*>(region + static_cast<int64_t>(index) * (HD / 2) + sub * 4),
            region[kv.groups_offset + static_cast<int64_t>(index) * (HD / 16) + sub / 2],
            reinterpret_cast<const float*>(region + kv.scales_offset)[index]};
  }
  static __device__ __forceinline__ void to_float(const Raw& r, float (&out)[8]) {
    const float step = e4m3_to_float(r.group) * r.scale;
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = e2m1_to_float((r.codes >> (4 * j)) & 15u) * step;
  }
};

// One warp per (row, kv head, K|V) of the step: the row's head_dim values (HD / 32 per lane,
// consecutive) are quantized into their slot's region.
template <int F, int HD>
__global__ void kv_write_quantized(KvLayout kv, const float* __restrict__ k, const float* __restrict__ v,
                                   const int32_t* __restrict__ slots) {
  constexpr int kPerLane = HD / 32;
  const int64_t row = blockIdx.x;
  const int32_t slot = slots[row];
  if (slot < 0) return;  // a row no slice writes
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int32_t page = slot / kKvRegionTokens;
  for (int task = warp; task < 2 * kv.num_kv_heads; task += warps) {
    const int which = task & 1, head = task >> 1;
    const float* src = (which == 0 ? k : v) + (row * kv.num_kv_heads + head) * HD + lane * kPerLane;
    float x[kPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      x[j] = src[j];
      amax = fmaxf(amax, fabsf(x[j]));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    uint8_t* region = const_cast<uint8_t*>(kv_region(kv, page, which));
    const int index = (slot % kKvRegionTokens) * kv.num_kv_heads + head;
    float scale;
    if constexpr (F == kKvNvfp4) {
      scale = __fdiv_rn(amax, 6.0f * 448.0f);
      const float inv = scale > 0.0f ? __frcp_rn(scale) : 0.0f;
      constexpr int kLanesPerGroup = 16 / kPerLane;
      float gmax = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) gmax = fmaxf(gmax, fabsf(x[j]));
#pragma unroll
      for (int off = kLanesPerGroup / 2; off > 0; off >>= 1) gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, off));
      const uint32_t group = float_to_e4m3(__fdiv_rn(__fmul_rn(gmax, inv), 6.0f));
      const float step = __fmul_rn(e4m3_to_float(group), scale);
      const float step_inv = step > 0.0f ? __frcp_rn(step) : 0.0f;
      uint8_t* codes = region + static_cast<int64_t>(index) * (HD / 2) + lane * (kPerLane / 2);
#pragma unroll
      for (int j = 0; j < kPerLane; j += 2)
        codes[j / 2] = static_cast<uint8_t>(float_to_e2m1(__fmul_rn(x[j], step_inv)) |
                                            (float_to_e2m1(__fmul_rn(x[j + 1], step_inv)) << 4));
      if (lane % kLanesPerGroup == 0)
        region[kv.groups_offset + static_cast<int64_t>(index) * (HD / 16) + lane / kLanesPerGroup] =
            static_cast<uint8_t>(group);
    } else {
      scale = __fdiv_rn(amax, F == kKvFp8 ? 448.0f : 127.0f);
      const float inv = scale > 0.0f ? __frcp_rn(scale) : 0.0f;
      uint8_t* codes = region + static_cast<int64_t>(index) * HD + lane * kPerLane;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const float y = __fmul_rn(x[j], inv);
        codes[j] = F == kKvFp8 ? static_cast<uint8_t>(float_to_e4m3(y))
                               : static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(rintf(y), -127.0f), 127.0f)));
      }
    }
    if (lane == 0) reinterpret_cast<float*>(region + kv.scales_offset)[index] = scale;
  }
}

}  // namespace ninfer::cuda::kernels
