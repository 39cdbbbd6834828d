#include "backends/cpu/gated_attention_cpu.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace ninfer::cpu {
namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

}  // namespace

void split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim,
                      float* query, float* gate) {
  require(tokens >= 0 && heads > 0 && head_dim > 0, "split_query_gate: bad dimensions");
  require(q_proj_out && query && gate, "split_query_gate: null pointer argument");
  const size_t bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t row = 0; row < tokens * heads; ++row) {
    const float* src = q_proj_out + row * 2 * head_dim;
    std::memcpy(query + row * head_dim, src, bytes);
    std::memcpy(gate + row * head_dim, src + head_dim, bytes);
  }
}

void rmsnorm_zero_centered(const float* x, int64_t x_stride, int64_t rows, int64_t dim,
                           const float* weight, float eps, float* out, int64_t out_stride) {
  require(rows >= 0 && dim > 0, "rmsnorm_zero_centered: bad dimensions");
  require(x_stride >= dim && out_stride >= dim, "rmsnorm_zero_centered: row stride < dim");
  require(x && weight && out, "rmsnorm_zero_centered: null pointer argument");
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* o = out + r * out_stride;
    double sum = 0.0;  // exact enough that the mean does not depend on summation order
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] * inv) * (1.0f + weight[i]);
  }
}

void rope_default_inv_freq(double theta, int64_t rotary_dim, float* inv_freq) {
  require(theta > 0.0, "rope_default_inv_freq: theta must be positive");
  require(rotary_dim > 0 && rotary_dim % 2 == 0,
          "rope_default_inv_freq: rotary_dim must be positive and even");
  for (int64_t j = 0; j < rotary_dim / 2; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(rotary_dim);
    inv_freq[j] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(exponent)));
  }
}

void rope_partial_neox(float* x, int64_t row_stride, int64_t tokens, int64_t heads,
                       int64_t head_dim, int64_t rotary_dim, const int64_t* positions,
                       const float* inv_freq, float attention_scaling) {
  require(tokens >= 0 && heads > 0 && head_dim > 0, "rope_partial_neox: bad dimensions");
  require(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim,
          "rope_partial_neox: rotary_dim must be even and in (0, head_dim]");
  require(row_stride >= heads * head_dim, "rope_partial_neox: row_stride < heads*head_dim");
  require(x && positions && inv_freq, "rope_partial_neox: null pointer argument");
  const int64_t half = rotary_dim / 2;
  float cos_table[512], sin_table[512];
  require(half <= 512, "rope_partial_neox: rotary_dim above 1024 is not supported");
  for (int64_t t = 0; t < tokens; ++t) {
    // Angle as an fp32 product (as HF computes freqs), cos/sin rounded from double.
    const float pos = static_cast<float>(positions[t]);
    for (int64_t j = 0; j < half; ++j) {
      const float angle = pos * inv_freq[j];
      cos_table[j] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling;
      sin_table[j] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        const float lo = v[j], hi = v[j + half];
        v[j] = lo * cos_table[j] - hi * sin_table[j];
        v[j + half] = hi * cos_table[j] + lo * sin_table[j];
      }
    }
  }
}

void sigmoid_gate_multiply(float* x, const float* gate, int64_t count) {
  require(count >= 0, "sigmoid_gate_multiply: count must be >= 0");
  for (int64_t i = 0; i < count; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

}  // namespace ninfer::cpu
