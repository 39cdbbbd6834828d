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
  FP8,    // e4m3 codes [rows, cols], then f32 scales per 128×128 block of each matrix
  NVFP4,  // e2m1 codes (2 per byte), e4m3 scales per 16 values, f32 scale per row
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
    case DType::FP8: return "fp8";
    case DType::NVFP4: return "nvfp4";
  }
  return "?";
}

inline DType dtype_from_name(std::string_view name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "bf16") return DType::BF16;
  if (name == "q8_0") return DType::Q8_0;
  if (name == "i32") return DType::I32;
  if (name == "fp8") return DType::FP8;
  if (name == "nvfp4") return DType::NVFP4;
  throw std::runtime_error("unknown tensor dtype '" + std::string(name) + "'");
}

inline bool is_block_quantized(DType t) { return t == DType::FP8 || t == DType::NVFP4; }

// Bytes of one row of `cols` elements (cols must be a multiple of 32 for Q8_0). For FP8 and
// NVFP4 only the codes: their scales follow all rows (QuantizedLayout).
inline int64_t row_bytes(DType t, int64_t cols) {
  switch (t) {
    case DType::F32: case DType::I32: return cols * 4;
    case DType::F16: case DType::BF16: return cols * 2;
    case DType::Q8_0: return cols / kQ8BlockSize * kQ8BlockBytes;
    case DType::FP8: return cols;
    case DType::NVFP4: return cols / 2;
  }
  return 0;
}

inline constexpr int64_t kFp8Block = 128;   // fp8 scale blocks: 128 rows × 128 columns
inline constexpr int64_t kNvfp4Group = 16;  // nvfp4 scale groups: 16 consecutive columns

// Where the parts of an FP8/NVFP4 tensor of `rows` rows (all leading axes) of `cols` lie,
// relative to its first byte (docs/artifact-format.md). `group_rows` is the row count of one
// matrix of a stack ([E, N, K]: N); FP8 block rows restart at each matrix.
struct QuantizedLayout {
  int64_t rows = 0, cols = 0, group_rows = 0;
  int64_t scale_offset = 0;   // fp8: f32 [groups, row_blocks, col_blocks]; nvfp4: e4m3 [rows, cols/16]
  int64_t scale2_offset = 0;  // nvfp4: f32 [rows]
  int64_t row_blocks = 0, col_blocks = 0;  // fp8, per matrix
  int64_t nbytes = 0;

  static QuantizedLayout of(DType t, int64_t rows, int64_t cols, int64_t group_rows) {
    QuantizedLayout l;
    l.rows = rows, l.cols = cols, l.group_rows = group_rows;
    auto align16 = [](int64_t n) { return (n + 15) / 16 * 16; };
    if (t == DType::FP8) {
      l.row_blocks = (group_rows + kFp8Block - 1) / kFp8Block;
      l.col_blocks = (cols + kFp8Block - 1) / kFp8Block;
      const int64_t groups = group_rows > 0 ? rows / group_rows : 0;
      l.scale_offset = align16(rows * cols);
      l.nbytes = l.scale_offset + 4 * groups * l.row_blocks * l.col_blocks;
    } else {
      l.scale_offset = rows * cols / 2;
      l.scale2_offset = align16(l.scale_offset + rows * cols / kNvfp4Group);
      l.nbytes = l.scale2_offset + 4 * rows;
    }
    return l;
  }
};

// Why a matrix of `cols` columns cannot be stored as `t`, or empty when it can.
inline std::string quantized_shape_problem(DType t, int64_t cols) {
  if (t == DType::FP8 && cols % 16 != 0) return "fp8 needs a last dimension divisible by 16";
  if (t == DType::NVFP4 && cols % 32 != 0) return "nvfp4 needs a last dimension divisible by 32";
  return {};
}

}  // namespace ninfer
