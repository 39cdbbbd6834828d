// The normalized config of a Qwen3.5/3.6 hybrid artifact (architectures qwen3_5, qwen3_5_moe;
// docs/artifact-format.md "Qwen3.5/3.6"), read and checked once for the model and kv_geometry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace ninfer {

class Artifact;

struct Qwen35Config {
  bool moe = false;                  // qwen3_5_moe: every layer's MLP is a sparse MoE block
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  int64_t max_positions = 0;
  float eps = 1e-6f;
  bool attn_output_gate = true;      // q_proj yields [query | gate] per head
  bool tie_embeddings = false;
  std::vector<bool> full_attention;  // per layer: gated full attention (else Gated DeltaNet)
  GdnShape gdn;
  int64_t intermediate = 0;          // dense MLP width (qwen3_5)
  int64_t num_experts = 0, top_k = 0, moe_ff = 0, shared_ff = 0;  // qwen3_5_moe
  bool norm_topk = true;
  int64_t mtp_layers = 0;            // MTP head decoder layers (full attention each)

  int64_t full_attention_layers() const;
  int64_t gdn_layers() const { return layers - full_attention_layers(); }
  // KV layers: the full-attention layers in order, then the MTP layers.
  int64_t kv_layers() const { return full_attention_layers() + mtp_layers; }
  // Layers of the KV pool: kv_layers(), but at least one (a pool needs one even when every
  // layer is a GDN layer, as the engine allocates positions as pages).
  int64_t kv_pool_layers() const { return kv_layers() > 0 ? kv_layers() : 1; }
};

bool is_qwen3_5_architecture(const std::string& architecture);

// Throws std::runtime_error naming the offending key for a missing or inconsistent value.
Qwen35Config read_qwen3_5_config(const Artifact& artifact);

}  // namespace ninfer
