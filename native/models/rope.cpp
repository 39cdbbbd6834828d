#include "models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace ninfer {

namespace {

// HF computes base ** (arange(0, dim, 2) / dim) in float32; exponents are exact multiples.
std::vector<float> base_frequencies(double theta, int64_t dim) {
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos_freq = static_cast<float>(std::pow(theta, static_cast<double>(exponent)));
    inv[static_cast<size_t>(i)] = 1.0f / pos_freq;
  }
  return inv;
}

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

RopeScaling::RopeScaling(const json::Value& config) {
  theta_ = config.get_double("rope_theta", 10000.0);
  const int64_t heads = config.get_int("num_attention_heads", 0);
  int64_t head_dim = config.get_int("head_dim", 0);
  if (head_dim <= 0 && heads > 0) head_dim = config.get_int("hidden_size", 0) / heads;
  if (head_dim <= 0) throw std::runtime_error("config: head_dim is missing or not positive");
  max_position_embeddings_ = config.get_int("max_position_embeddings", 0);
  scaling_ = config["rope_scaling"];
  double partial = config.get_double("partial_rotary_factor", 1.0);
  if (scaling_.is_object()) {
    type_ = scaling_.get_string("rope_type", scaling_.get_string("type", "default"));
    partial = scaling_.get_double("partial_rotary_factor", partial);
  }
  rotary_dim_ = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
  if (rotary_dim_ <= 0 || rotary_dim_ % 2 != 0 || rotary_dim_ > head_dim)
    throw std::runtime_error("config: rotary dimension " + std::to_string(rotary_dim_) + " is not usable");
  if (type_ != "default" && type_ != "linear" && type_ != "llama3" && type_ != "yarn" && type_ != "dynamic")
    throw std::runtime_error("config: unsupported rope_scaling type '" + type_ + "'");
  table(max_position_embeddings_ > 0 ? max_position_embeddings_ : 1);  // validates parameters now
}

double RopeScaling::param(const char* key) const {
  const json::Value& v = scaling_[key];
  if (!v.is_number())
    throw std::runtime_error("config: rope_scaling of type '" + type_ + "' needs a number '" + key + "'");
  return v.as_double();
}

RopeTable RopeScaling::table(int64_t seq_len) const {
  const int64_t dim = rotary_dim_;
  RopeTable out;
  if (type_ == "default") {
    out.inv_freq = base_frequencies(theta_, dim);
  } else if (type_ == "linear") {
    out.inv_freq = base_frequencies(theta_, dim);
    const auto factor = static_cast<float>(param("factor"));
    for (auto& f : out.inv_freq) f /= factor;
  } else if (type_ == "dynamic") {
    // NTK-aware base stretching once the sequence outgrows the trained context.
    const double factor = param("factor");
    const auto max_pos = static_cast<double>(max_position_embeddings_);
    const double len = std::max(static_cast<double>(seq_len), max_pos);
    const double base = theta_ * std::pow(factor * len / max_pos - (factor - 1.0),
                                          static_cast<double>(dim) / static_cast<double>(dim - 2));
    out.inv_freq = base_frequencies(base, dim);
  } else if (type_ == "llama3") {
    const double factor = param("factor"), low = param("low_freq_factor"), high = param("high_freq_factor");
    const double old_len = param("original_max_position_embeddings");
    const double low_wavelen = old_len / low, high_wavelen = old_len / high;
    out.inv_freq = base_frequencies(theta_, dim);
    // Float32 arithmetic step by step, as HF's tensor expression evaluates it.
    const auto f_factor = static_cast<float>(factor), f_low = static_cast<float>(low);
    const auto f_old_len = static_cast<float>(old_len), f_span = static_cast<float>(high - low);
    for (auto& f : out.inv_freq) {
      const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / f;
      if (wavelen > low_wavelen) {
        f = f / f_factor;
      } else if (wavelen >= high_wavelen) {
        const float smooth = (f_old_len / wavelen - f_low) / f_span;
        f = (1.0f - smooth) * f / f_factor + smooth * f;
      }
    }
  } else if (type_ == "yarn") {
    const double original = param("original_max_position_embeddings");
    const json::Value& factor_value = scaling_["factor"];
    const double factor = factor_value.is_number() ? factor_value.as_double()
                                                   : static_cast<double>(max_position_embeddings_) / original;
    const json::Value& given = scaling_["attention_factor"];
    const double mscale = scaling_.get_double("mscale", 0.0), mscale_all = scaling_.get_double("mscale_all_dim", 0.0);
    if (given.is_number())
      out.attention_factor = static_cast<float>(given.as_double());
    else if (mscale != 0.0 && mscale_all != 0.0)
      out.attention_factor = static_cast<float>(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all));
    else
      out.attention_factor = static_cast<float>(yarn_mscale(factor, 1.0));
    double beta_fast = scaling_.get_double("beta_fast", 0.0), beta_slow = scaling_.get_double("beta_slow", 0.0);
    if (beta_fast == 0.0) beta_fast = 32.0;
    if (beta_slow == 0.0) beta_slow = 1.0;
    const auto correction_dim = [&](double rotations) {
      return static_cast<double>(dim) * std::log(original / (rotations * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(theta_));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (scaling_.get_bool("truncate", true)) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    const std::vector<float> extrapolation = base_frequencies(theta_, dim);
    out.inv_freq.resize(extrapolation.size());
    for (size_t i = 0; i < extrapolation.size(); ++i) {
      const float ramp = std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
      const float keep = 1.0f - ramp;  // share of the unscaled (extrapolated) frequency
      const float interpolation = 1.0f / (static_cast<float>(factor) * (1.0f / extrapolation[i]));
      out.inv_freq[i] = interpolation * (1.0f - keep) + extrapolation[i] * keep;
    }
  }
  return out;
}

}  // namespace ninfer
