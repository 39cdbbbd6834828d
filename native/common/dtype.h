// Element formats of weights and activations.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ninfer {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  Q8_0,  // GGUF Q8_0 blocks along the last axis: {fp16 scale, int8 q[32]} = 34 bytes per 32 values
  I32,
};

inline constexpr int64_t kQ8BlockSize = 32;
inline constexpr int64_t kQ8BlockBytes = 34;

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8_0: return "q8_0";
    case DType::I32: return "i32";
  }
  return "?";
}

inline DType dtype_from_name(std::string_view name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "bf16") return DType::BF16;
  if (name == "q8_0") return DType::Q8_0;
  if (name == "i32") return DType::I32;
  throw std::runtime_error("unknown tensor dtype '" + std::string(name) + "'");
}

// Bytes of one row of `cols` elements (cols must be a multiple of 32 for Q8_0).
inline int64_t row_bytes(DType t, int64_t cols) {
  switch (t) {
    case DType::F32: case DType::I32: return cols * 4;
    case DType::F16: case DType::BF16: return cols * 2;
    case DType::Q8_0: return cols / kQ8BlockSize * kQ8BlockBytes;
  }
  return 0;
}

}  // namespace ninfer
