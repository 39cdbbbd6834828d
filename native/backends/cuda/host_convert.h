// Host-side conversion of artifact tensor rows (f32, f16, bf16, q8_0) to bf16 or f32 before
// upload; the device keeps every weight as bf16.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/cpu/float_convert.h"
#include "common/dtype.h"

namespace ninfer::cuda {

// Round to nearest even, NaN kept quiet.
inline uint16_t f32_to_bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Element i of a row of `dtype` as float.
inline void row_to_f32(DType dtype, const void* src, int64_t cols, float* dst) {
  switch (dtype) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(cols) * 4); return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < cols; ++i) dst[i] = cpu::f16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < cols; ++i) dst[i] = cpu::bf16_to_f32(h[i]);
      return;
    }
    case DType::Q8_0: {
      const auto* blocks = static_cast<const uint8_t*>(src);
      for (int64_t b = 0; b < cols / kQ8BlockSize; ++b) {
        const uint8_t* block = blocks + b * kQ8BlockBytes;
        uint16_t scale_bits;
        std::memcpy(&scale_bits, block, 2);
        const float scale = cpu::f16_to_f32(scale_bits);
        const auto* q = reinterpret_cast<const int8_t*>(block + 2);
        for (int l = 0; l < kQ8BlockSize; ++l) dst[b * kQ8BlockSize + l] = scale * q[l];
      }
      return;
    }
    case DType::I32: case DType::FP8: case DType::NVFP4: break;
  }
  throw std::runtime_error("cannot convert a " + std::string(dtype_name(dtype)) + " row to f32");
}

}  // namespace ninfer::cuda
