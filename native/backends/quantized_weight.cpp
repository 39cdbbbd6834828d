#include "backends/quantized_weight.h"

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ninfer {

Weight quantized_weight_at(DType dtype, int64_t rows, int64_t cols, int64_t group_rows, const void* base) {
  if (!is_block_quantized(dtype)) throw std::invalid_argument("quantized_weight_at: not an fp8/nvfp4 dtype");
  if (const std::string problem = quantized_shape_problem(dtype, cols); !problem.empty())
    throw std::invalid_argument(problem);
  if (group_rows <= 0 || rows % group_rows != 0)
    throw std::invalid_argument("quantized weight: rows must be a whole number of matrices");
  const QuantizedLayout layout = QuantizedLayout::of(dtype, rows, cols, group_rows);
  const auto* bytes = static_cast<const uint8_t*>(base);
  Weight w{dtype, rows, cols, base};
  w.scales = bytes + layout.scale_offset;
  w.scale2 = dtype == DType::NVFP4 ? reinterpret_cast<const float*>(bytes + layout.scale2_offset) : nullptr;
  w.group_rows = group_rows;
  return w;
}

Weight weight_rows(const Weight& w, int64_t first, int64_t count) {
  if (first < 0 || count < 0 || first + count > w.rows) throw std::out_of_range("weight_rows: rows out of range");
  Weight out = w;
  out.rows = count;
  out.data = static_cast<const uint8_t*>(w.data) + first * row_bytes(w.dtype, w.cols);
  out.first_row = w.first_row + first;
  return out;
}

namespace {

std::array<float, 256> e4m3_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 15, m = c & 7;
    float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
    if ((c & 0x7f) == 0x7f) v = NAN;
    t[static_cast<size_t>(c)] = c & 0x80 ? -v : v;
  }
  return t;
}

const std::array<float, 256> kE4m3 = e4m3_table();
constexpr float kE2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

float e4m3_to_float(uint8_t code) { return kE4m3[code]; }
float e2m1_to_float(uint8_t code) { return kE2m1[code & 15]; }

void dequantize_rows(const Weight& w, int64_t r0, int64_t n, float* out) {
  const int64_t k = w.cols;
  if (w.dtype == DType::FP8) {
    const auto* codes = static_cast<const uint8_t*>(w.data);
    const auto* scales = static_cast<const float*>(w.scales);
    const int64_t row_blocks = (w.group_rows + kFp8Block - 1) / kFp8Block, col_blocks = (k + kFp8Block - 1) / kFp8Block;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = w.first_row + r0 + i;  // row in the whole tensor
      const float* s = scales + ((g / w.group_rows) * row_blocks + (g % w.group_rows) / kFp8Block) * col_blocks;
      const uint8_t* row = codes + (r0 + i) * k;
      for (int64_t c = 0; c < k; ++c) out[i * k + c] = kE4m3[row[c]] * s[c / kFp8Block];
    }
    return;
  }
  if (w.dtype == DType::NVFP4) {
    const auto* packed = static_cast<const uint8_t*>(w.data);
    const auto* scales = static_cast<const uint8_t*>(w.scales);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = w.first_row + r0 + i;
      const uint8_t* row = packed + (r0 + i) * (k / 2);
      const uint8_t* s = scales + g * (k / kNvfp4Group);
      const float row_scale = w.scale2[g];
      for (int64_t c = 0; c < k; c += 2) {
        const float group = kE4m3[s[c / kNvfp4Group]];  // code × group scale is exact
        out[i * k + c] = kE2m1[row[c / 2] & 15] * group * row_scale;
        out[i * k + c + 1] = kE2m1[row[c / 2] >> 4] * group * row_scale;
      }
    }
    return;
  }
  throw std::invalid_argument("dequantize_rows: " + std::string(dtype_name(w.dtype)) + " is not fp8/nvfp4");
}

}  // namespace ninfer
