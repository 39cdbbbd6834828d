// KV-cache storage formats (--kv-dtype) and their host reference codecs.
//
// bf16 is the unquantized store: the backend's own float type (f32 on the CPU, bf16 on CUDA).
// The quantized formats keep every (token, kv head) row of head_dim values self-contained:
//   fp8    e4m3 codes (1 byte each) and one f32 scale   s = amax / 448
//   int8   symmetric codes in [-127, 127] and one f32   s = amax / 127
//   nvfp4  e2m1 codes (2 per byte, low nibble first), one e4m3 scale per 16 values and one
//          f32 scale s = amax / (6 · 448); a group's scale is e4m3(group_amax / (6 · s))
// A value is code · s (nvfp4: e2m1(code) · e4m3(group scale) · s). Scales per token-head, not
// per page: a token is quantized from its own values when it is appended, so later tokens
// never force existing ones to be rescaled (a shared page scale would have to grow with the
// page's maximum), a speculative rollback simply forgets tokens, and a cached block's bytes
// mean the same wherever they are copied.
//
// Layout of one (layer, page, K or V) region of a quantized pool, in bytes (KvRegion):
//   codes          [64 tokens][num_kv_heads][code_bytes]       code_bytes = head_dim (fp8,
//                                                                int8) or head_dim / 2 (nvfp4)
//   group scales   [64][num_kv_heads][head_dim / 16] e4m3      nvfp4 only
//   scales         [64][num_kv_heads] f32
// Every part starts 16-byte aligned (head_dim is a multiple of 16).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ninfer {

enum class KvDType : uint8_t { BF16 = 0, FP8 = 1, INT8 = 2, NVFP4 = 3 };

inline std::string_view kv_dtype_name(KvDType t) {
  switch (t) {
    case KvDType::BF16: return "bf16";
    case KvDType::FP8: return "fp8";
    case KvDType::INT8: return "int8";
    case KvDType::NVFP4: return "nvfp4";
  }
  return "?";
}

inline constexpr std::string_view kKvDTypeNames = "bf16, fp8, int8, nvfp4";

inline KvDType kv_dtype_from_name(std::string_view name) {
  if (name == "bf16") return KvDType::BF16;
  if (name == "fp8") return KvDType::FP8;
  if (name == "int8") return KvDType::INT8;
  if (name == "nvfp4") return KvDType::NVFP4;
  if (name == "k8v4" || name == "vq2" || name == "k4v2")
    throw std::invalid_argument("kv dtype '" + std::string(name) + "' is not built yet; this build stores " +
                                std::string(kKvDTypeNames));
  throw std::invalid_argument("unknown kv dtype '" + std::string(name) + "' (expected " + std::string(kKvDTypeNames) +
                              ")");
}

inline constexpr int64_t kKvGroup = 16;  // nvfp4 values per e4m3 group scale

// Where the parts of one quantized (layer, page, K|V) region lie (see the header comment).
struct KvRegion {
  int64_t code_bytes = 0;     // per token-head
  int64_t group_bytes = 0;    // per token-head (nvfp4: head_dim / 16)
  int64_t groups_offset = 0;  // bytes from the region start
  int64_t scales_offset = 0;
  int64_t bytes = 0;          // the whole region

  static KvRegion of(KvDType t, int64_t tokens, int64_t num_kv_heads, int64_t head_dim) {
    KvRegion r;
    if (t == KvDType::BF16) throw std::logic_error("KvRegion: bf16 is not a quantized KV format");
    r.code_bytes = t == KvDType::NVFP4 ? head_dim / 2 : head_dim;
    r.group_bytes = t == KvDType::NVFP4 ? head_dim / kKvGroup : 0;
    const int64_t rows = tokens * num_kv_heads;
    r.groups_offset = rows * r.code_bytes;
    r.scales_offset = r.groups_offset + (rows * r.group_bytes + 15) / 16 * 16;
    r.bytes = r.scales_offset + rows * 4;
    return r;
  }
};

namespace kvcodec {

// e4m3 (OCP "fn": no infinities, 0x7f is NaN, largest finite 448) to float.
inline float e4m3_to_float(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  float v = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                          : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return sign ? -v : v;
}

// Nearest e4m3 code (ties to the even code), saturating at ±448; NaN becomes 0.
inline uint8_t float_to_e4m3(float x) {
  static const std::array<float, 127> table = [] {
    std::array<float, 127> t{};
    for (int c = 0; c < 127; ++c) t[static_cast<size_t>(c)] = e4m3_to_float(static_cast<uint8_t>(c));
    return t;
  }();
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 126;
  const auto* hi = std::lower_bound(table.begin(), table.end(), a);  // first value >= a
  int c = static_cast<int>(hi - table.begin());
  if (c > 0) {
    const float below = table[static_cast<size_t>(c - 1)], above = table[static_cast<size_t>(c)];
    if (a - below < above - a || (a - below == above - a && (c - 1) % 2 == 0)) --c;
  }
  return sign | static_cast<uint8_t>(c);
}

inline constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline float e2m1_to_float(uint8_t code) {
  const float v = kE2m1Values[code & 7];
  return code & 8 ? -v : v;
}

// Nearest e2m1 code (ties to the even code), saturating at ±6. The same comparisons run on
// the device (kernels_kv_quant.cuh), so both produce the same codes.
inline uint8_t float_to_e2m1(float x) {
  const float a = std::fabs(x);
  const uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5
                  : a <= 5.0f ? 6 : 7;
  return static_cast<uint8_t>((std::signbit(x) && c != 0 ? 8 : 0) | c);
}

inline float amax_of(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// Quantizes one token-head row of head_dim values: codes (code_bytes), group scales (nvfp4)
// and the row scale. An all-zero row has scale 0 and zero codes.
inline void quantize_row(KvDType t, const float* x, int64_t head_dim, uint8_t* codes, uint8_t* groups,
                         float* scale) {
  if (head_dim <= 0 || head_dim % kKvGroup != 0)
    throw std::invalid_argument("quantize_row: head_dim must be a positive multiple of 16");
  const float amax = amax_of(x, head_dim);
  switch (t) {
    case KvDType::FP8: {
      const float s = amax / 448.0f;
      const float inv = s > 0.0f ? 1.0f / s : 0.0f;
      for (int64_t i = 0; i < head_dim; ++i) codes[i] = float_to_e4m3(x[i] * inv);
      *scale = s;
      return;
    }
    case KvDType::INT8: {
      const float s = amax / 127.0f;
      const float inv = s > 0.0f ? 1.0f / s : 0.0f;
      for (int64_t i = 0; i < head_dim; ++i)
        codes[i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f)));
      *scale = s;
      return;
    }
    case KvDType::NVFP4: {
      const float s = amax / (6.0f * 448.0f);
      const float inv = s > 0.0f ? 1.0f / s : 0.0f;
      std::memset(codes, 0, static_cast<size_t>(head_dim / 2));
      for (int64_t g = 0; g < head_dim / kKvGroup; ++g) {
        const float* v = x + g * kKvGroup;
        const uint8_t gs = float_to_e4m3(amax_of(v, kKvGroup) * inv / 6.0f);
        groups[g] = gs;
        const float step = e4m3_to_float(gs) * s;
        const float step_inv = step > 0.0f ? 1.0f / step : 0.0f;
        for (int64_t i = 0; i < kKvGroup; ++i) {
          const uint8_t c = float_to_e2m1(v[i] * step_inv);
          const int64_t at = g * kKvGroup + i;
          codes[at / 2] |= static_cast<uint8_t>(at % 2 ? c << 4 : c);
        }
      }
      *scale = s;
      return;
    }
    case KvDType::BF16: break;
  }
  throw std::logic_error("quantize_row: not a quantized KV format");
}

inline void dequantize_row(KvDType t, const uint8_t* codes, const uint8_t* groups, float scale, int64_t head_dim,
                           float* out) {
  switch (t) {
    case KvDType::FP8:
      for (int64_t i = 0; i < head_dim; ++i) out[i] = e4m3_to_float(codes[i]) * scale;
      return;
    case KvDType::INT8:
      for (int64_t i = 0; i < head_dim; ++i) out[i] = static_cast<float>(static_cast<int8_t>(codes[i])) * scale;
      return;
    case KvDType::NVFP4:
      for (int64_t i = 0; i < head_dim; ++i) {
        const uint8_t c = i % 2 ? codes[i / 2] >> 4 : codes[i / 2] & 15;
        out[i] = e2m1_to_float(c) * (e4m3_to_float(groups[i / kKvGroup]) * scale);
      }
      return;
    case KvDType::BF16: break;
  }
  throw std::logic_error("dequantize_row: not a quantized KV format");
}

}  // namespace kvcodec
}  // namespace ninfer
