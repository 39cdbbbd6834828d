#include "models/qwen3_5_config.h"

#include <stdexcept>
#include <string>

#include "artifact/artifact.h"

namespace ninfer {

namespace {

int64_t positive(const json::Value& c, const char* key) {
  const json::Value& v = c[key];
  if (!v.is_number() || v.as_int() <= 0)
    throw std::runtime_error(std::string("config: '") + key + "' must be a positive integer");
  return v.as_int();
}

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error("config: " + what); }

}  // namespace

int64_t Qwen35Config::full_attention_layers() const {
  int64_t n = 0;
  for (bool full : full_attention) n += full ? 1 : 0;
  return n;
}

bool is_qwen3_5_architecture(const std::string& architecture) {
  return architecture == "qwen3_5" || architecture == "qwen3_5_moe";
}

Qwen35Config read_qwen3_5_config(const Artifact& artifact) {
  const json::Value& c = artifact.config();
  Qwen35Config cfg;
  cfg.moe = artifact.architecture() == "qwen3_5_moe";
  cfg.hidden = positive(c, "hidden_size");
  cfg.layers = positive(c, "num_hidden_layers");
  cfg.heads = positive(c, "num_attention_heads");
  cfg.kv_heads = positive(c, "num_key_value_heads");
  cfg.head_dim = positive(c, "head_dim");
  cfg.vocab = positive(c, "vocab_size");
  cfg.max_positions = c.get_int("max_position_embeddings", 0);
  cfg.eps = static_cast<float>(c.get_double("rms_norm_eps", 1e-6));
  cfg.attn_output_gate = c.get_bool("attn_output_gate", true);
  cfg.tie_embeddings = c.get_bool("tie_word_embeddings", false);
  if (cfg.heads % cfg.kv_heads != 0) bad("num_attention_heads must be a multiple of num_key_value_heads");

  const json::Value& types = c["layer_types"];
  if (!types.is_array() || static_cast<int64_t>(types.size()) != cfg.layers)
    bad("'layer_types' must list one type per hidden layer");
  for (const auto& t : types.as_array()) {
    const std::string type = t.is_string() ? t.as_string() : std::string();
    if (type != "full_attention" && type != "linear_attention")
      bad("layer type '" + type + "' is neither full_attention nor linear_attention");
    cfg.full_attention.push_back(type == "full_attention");
  }

  cfg.gdn.key_heads = positive(c, "linear_num_key_heads");
  cfg.gdn.value_heads = positive(c, "linear_num_value_heads");
  cfg.gdn.key_dim = positive(c, "linear_key_head_dim");
  cfg.gdn.value_dim = positive(c, "linear_value_head_dim");
  cfg.gdn.conv_kernel = positive(c, "linear_conv_kernel_dim");
  cfg.gdn.norm_eps = cfg.eps;
  if (cfg.gdn.value_heads % cfg.gdn.key_heads != 0)
    bad("linear_num_value_heads must be a multiple of linear_num_key_heads");

  if (cfg.moe) {
    cfg.num_experts = positive(c, "num_experts");
    cfg.top_k = positive(c, "num_experts_per_tok");
    cfg.moe_ff = positive(c, "moe_intermediate_size");
    cfg.shared_ff = positive(c, "shared_expert_intermediate_size");
    cfg.norm_topk = c.get_bool("norm_topk_prob", true);
    if (cfg.top_k > cfg.num_experts) bad("num_experts_per_tok exceeds num_experts");
  } else {
    cfg.intermediate = positive(c, "intermediate_size");
  }
  cfg.mtp_layers = c.get_int("mtp_num_hidden_layers", 0);
  if (cfg.mtp_layers < 0) bad("'mtp_num_hidden_layers' must be >= 0");
  if (c.get_bool("mtp_use_dedicated_embeddings", false))
    bad("mtp_use_dedicated_embeddings=true is not supported");
  return cfg;
}

}  // namespace ninfer
