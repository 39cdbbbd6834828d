#include "backends/cpu/cpu_backend.h"
#include "backends/quantized_weight.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "artifact/artifact.h"
#include "backends/cpu/float_convert.h"

namespace ninfer {

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

namespace cpu {

namespace {

constexpr int64_t kElementwiseGrain = 1 << 14;  // below this, threading costs more than it saves

void convert_row(DType dtype, const void* src, int64_t cols, float* dst) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(cols) * sizeof(float));
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < cols; ++i) dst[i] = f16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < cols; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q8_0: {
      const auto* blocks = static_cast<const uint8_t*>(src);
      for (int64_t b = 0; b < cols / kQ8BlockSize; ++b) {
        const uint8_t* block = blocks + b * kQ8BlockBytes;
        uint16_t scale_bits;
        std::memcpy(&scale_bits, block, 2);
        const float scale = f16_to_f32(scale_bits);
        const auto* q = reinterpret_cast<const int8_t*>(block + 2);
        for (int l = 0; l < kQ8BlockSize; ++l) dst[b * kQ8BlockSize + l] = scale * q[l];
      }
      return;
    }
    case DType::I32: case DType::FP8: case DType::NVFP4: break;  // FP8/NVFP4: dequantize_rows
  }
  throw std::runtime_error("cannot convert a " + std::string(dtype_name(dtype)) + " row to f32");
}

}  // namespace

CpuBackend::CpuBackend(int threads) : pool_(threads) {}

Buffer CpuBackend::alloc(int64_t elements) {
  if (elements < 0) throw std::invalid_argument("CpuBackend::alloc: negative size");
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(elements, 1)) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return Buffer(std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { std::free(q); }), elements);
}

Weight CpuBackend::upload_weight(const TensorView& t) {
  if (t.shape.empty() || t.shape.size() > 2)
    throw std::runtime_error("tensor '" + t.name + "': a weight must be 1-D or 2-D");
  if (t.dtype == DType::I32)
    throw std::runtime_error("tensor '" + t.name + "': i32 is not a weight format");
  const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
  if (is_block_quantized(t.dtype)) {
    const int64_t group_rows = std::min(t.group_rows, rows);
    if (static_cast<uint64_t>(QuantizedLayout::of(t.dtype, rows, t.shape.back(), group_rows).nbytes) != t.nbytes)
      throw std::runtime_error("tensor '" + t.name + "': byte size does not match its shape");
    return quantized_weight_at(t.dtype, rows, t.shape.back(), group_rows, t.data);  // zero copy
  }
  Weight w{t.dtype, rows, t.shape.back(), t.data};
  if (w.dtype == DType::Q8_0 && w.cols % kQ8BlockSize != 0)
    throw std::runtime_error("tensor '" + t.name + "': q8_0 rows must be a multiple of 32");
  if (static_cast<uint64_t>(row_bytes(w.dtype, w.cols) * w.rows) != t.nbytes)
    throw std::runtime_error("tensor '" + t.name + "': byte size does not match its shape");
  return w;
}

namespace {

// splitmix64, the CUDA backend's generator: the same seed gives the same weights on both.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

Weight CpuBackend::random_weight(int64_t rows, int64_t cols, uint64_t seed, float scale) {
  if (rows <= 0 || cols <= 0) throw std::invalid_argument("random_weight: rows and cols must be positive");
  const int64_t n = rows * cols;
  const size_t bytes = (static_cast<size_t>(n) * sizeof(uint16_t) + 63) / 64 * 64;
  auto* data = static_cast<uint16_t*>(std::aligned_alloc(64, bytes));
  if (!data) throw std::bad_alloc();
  random_weights_.emplace_back(data, [](uint16_t* p) { std::free(p); });
  const uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
  pool_.parallel_ranges(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float unit = static_cast<float>(mix64(key ^ static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
      data[i] = f32_to_bf16((2.0f * unit - 1.0f) * scale);
    }
  });
  return Weight{DType::BF16, rows, cols, data};
}

namespace {

// The code CUDA's __nv_cvt_float_to_fp8(v, satfinite, e4m3) gives: the nearest finite e4m3
// value, ties to the even code.
uint8_t nearest_e4m3(float v) {
  uint8_t best = 0;
  float best_error = INFINITY;
  for (int code = 0; code < 0x7F; ++code) {  // 0x7F is NaN
    const float error = std::fabs(std::fabs(v) - e4m3_to_float(static_cast<uint8_t>(code)));
    if (error < best_error || (error == best_error && (code & 1) == 0)) best = static_cast<uint8_t>(code), best_error = error;
  }
  return static_cast<uint8_t>(best | (v < 0.0f && best != 0 ? 0x80 : 0));
}

}  // namespace

// The CUDA backend's random_codes and scale fills (launchers_gemv_quant.cu) on the host: the
// same seed gives the same fp8/nvfp4 weights on both backends.
Weight CpuBackend::random_quantized_weight(DType dtype, int64_t rows, int64_t cols, int64_t group_rows, uint64_t seed,
                                           float scale) {
  // Expert stacks are bf16 on CUDA (its upload_quantized): the same here.
  if (!is_block_quantized(dtype) || group_rows < rows) return random_weight(rows, cols, seed, scale);
  if (const std::string problem = quantized_shape_problem(dtype, cols); !problem.empty())
    throw std::invalid_argument("random_quantized_weight: " + problem);
  const bool nvfp4 = dtype == DType::NVFP4;
  const QuantizedLayout layout = QuantizedLayout::of(dtype, rows, cols, group_rows);
  const size_t bytes = (static_cast<size_t>(layout.nbytes) + 63) / 64 * 64;
  auto* blob = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (!blob) throw std::bad_alloc();
  random_quantized_.emplace_back(blob, [](uint8_t* p) { std::free(p); });
  std::memset(blob, 0, bytes);
  // Code of each random byte b (u = 2b/255 - 1 in [-1, 1]).
  uint8_t code_of[256];
  for (int b = 0; b < 256; ++b) {
    const float u = 2.0f * static_cast<float>(b) / 255.0f - 1.0f;
    if (nvfp4) {
      const float a = std::fabs(6.0f * u);  // e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
      const uint8_t mag = a < 0.25f ? 0 : a < 0.75f ? 1 : a < 1.25f ? 2 : a < 1.75f ? 3 : a < 2.5f ? 4
                          : a < 3.5f ? 5 : a < 5.0f ? 6 : 7;
      code_of[b] = static_cast<uint8_t>((u < 0.0f && mag ? 8 : 0) | mag);
    } else {
      code_of[b] = nearest_e4m3(448.0f * u);
    }
  }
  const int64_t code_bytes = nvfp4 ? rows * cols / 2 : rows * cols;
  const uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
  pool_.parallel_ranges(code_bytes / 4, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t r = mix64(key ^ static_cast<uint64_t>(i));
      uint32_t word = 0;
      for (int j = 0; j < (nvfp4 ? 8 : 4); ++j) {
        const uint32_t code = code_of[(r >> (8 * (j % 8))) & 0xFF];
        word |= code << (nvfp4 ? 4 * j : 8 * j);
      }
      std::memcpy(blob + 4 * i, &word, 4);
    }
  });
  if (nvfp4) {
    std::memset(blob + layout.scale_offset, 0x7E, static_cast<size_t>(rows * cols / kNvfp4Group));  // 448
    auto* row_scales = reinterpret_cast<float*>(blob + layout.scale2_offset);
    for (int64_t r = 0; r < rows; ++r) row_scales[r] = scale / 2688.0f;
  } else {
    auto* block_scales = reinterpret_cast<float*>(blob + layout.scale_offset);
    for (int64_t i = 0; i < (layout.nbytes - layout.scale_offset) / 4; ++i) block_scales[i] = scale / 448.0f;
  }
  return quantized_weight_at(dtype, rows, cols, group_rows, blob);
}

Buffer CpuBackend::upload_vector(const TensorView& t) {
  if (t.shape.size() != 1)
    throw std::runtime_error("tensor '" + t.name + "': expected a 1-D tensor");
  const Weight w = upload_weight(t);
  Buffer out = alloc(w.cols);
  convert_row(w.dtype, w.data, w.cols, out.data());
  return out;
}

void CpuBackend::copy_from_host(float* dst, const float* src, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void CpuBackend::copy_to_host(float* dst, const float* src, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void CpuBackend::embedding(const Weight& table, std::span<const int32_t> tokens, float* out) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= table.rows)
      throw std::out_of_range("token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                              std::to_string(table.rows) + ")");
  const int64_t stride = row_bytes(table.dtype, table.cols);
  pool_.parallel_ranges(static_cast<int64_t>(tokens.size()), 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      convert_row(table.dtype, static_cast<const uint8_t*>(table.data) + tokens[i] * stride, table.cols,
                  out + i * table.cols);
  });
}

void CpuBackend::rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                          float* y) {
  const auto& k = cpu_kernels();
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(cols, 1));
  pool_.parallel_ranges(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const float mean_square = k.dot(xr, xr, cols) / static_cast<float>(cols);
      const float inv = 1.0f / std::sqrt(mean_square + eps);
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * inv * weight[c];
    }
  });
}

void CpuBackend::rope(float* x, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                      std::span<const int32_t> positions, std::span<const float> inv_freq,
                      float attention_factor) {
  const int64_t half = rotary_dim / 2;
  if (rotary_dim % 2 != 0 || rotary_dim > head_dim || static_cast<int64_t>(inv_freq.size()) != half)
    throw std::invalid_argument("rope: rotary_dim must be even, <= head_dim, and match inv_freq");
  const int64_t tokens = static_cast<int64_t>(positions.size());
  pool_.parallel_ranges(tokens, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        // The angle is rounded to float32 as Hugging Face computes it; cos/sin then exact.
        const double angle = static_cast<float>(positions[t]) * inv_freq[i];
        cos_t[i] = static_cast<float>(std::cos(angle)) * attention_factor;
        sin_t[i] = static_cast<float>(std::sin(angle)) * attention_factor;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cos_t[i] - b * sin_t[i];
          v[i + half] = b * cos_t[i] + a * sin_t[i];
        }
      }
    }
  });
}

void CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  pool_.parallel_ranges(n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void CpuBackend::add(float* y, const float* x, int64_t n) {
  pool_.parallel_ranges(n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += x[i];
  });
}

void CpuBackend::gather_rows(const float* src, int64_t cols, std::span<const int32_t> rows, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst + static_cast<int64_t>(i) * cols, src + static_cast<int64_t>(rows[i]) * cols,
                static_cast<size_t>(cols) * sizeof(float));
}

}  // namespace cpu
}  // namespace ninfer
