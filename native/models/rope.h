// Rotary position embedding frequencies from an HF-style config, with the rope_scaling
// variants computed the way Hugging Face transformers computes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/json.h"

namespace ninfer {

struct RopeTable {
  std::vector<float> inv_freq;      // rotary_dim / 2 inverse frequencies
  float attention_factor = 1.0f;    // multiplies cos and sin (YaRN)
};

class RopeScaling {
 public:
  // Reads rope_theta, rope_scaling (null or {rope_type|type: default|linear|llama3|yarn|dynamic,
  // ...}), head_dim, max_position_embeddings and partial_rotary_factor from `config`.
  // Throws std::runtime_error for an unknown type or a missing parameter.
  explicit RopeScaling(const json::Value& config);

  const std::string& type() const { return type_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  // True when the table depends on the sequence length (dynamic NTK).
  bool depends_on_length() const { return type_ == "dynamic"; }
  // The table for a sequence whose longest position is seq_len - 1.
  RopeTable table(int64_t seq_len) const;

 private:
  double param(const char* key) const;

  std::string type_ = "default";
  json::Value scaling_;
  double theta_ = 10000.0;
  int64_t rotary_dim_ = 0;
  int64_t max_position_embeddings_ = 0;
};

}  // namespace ninfer
