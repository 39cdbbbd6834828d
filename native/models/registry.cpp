// Architecture dispatch: the one place that maps an artifact's architecture to a Model.
#include <stdexcept>
#include <string>

#include "artifact/artifact.h"
#include "models/llama.h"
#include "models/model.h"
#include "models/qwen3_5.h"
#include "models/qwen3_5_config.h"
#include "parallel/tensor_parallel_model.h"

namespace ninfer {

namespace {

bool is_dense_llama_family(const std::string& architecture) {
  return architecture == "llama" || architecture == "qwen2" || architecture == "qwen3";
}

[[noreturn]] void unsupported(const std::string& architecture) {
  throw std::runtime_error("unsupported model architecture '" + architecture +
                           "' (this build supports llama, qwen2, qwen3, qwen3_5, qwen3_5_moe)");
}

}  // namespace

void Model::forward_sampled(const BatchPlan&, const SamplingBatch&, int32_t*) {
  throw std::logic_error("the " + info().architecture + " model does not sample on its device");
}

void Model::save_snapshot(int, int) {
  throw std::logic_error("the " + info().architecture + " model keeps no state outside its KV pages to snapshot");
}

void Model::kv_page_io(int32_t, void*, bool) {
  throw std::logic_error("the " + info().architecture + " model cannot copy KV pages to the host");
}

void Model::snapshot_io(int, float*, bool) {
  throw std::logic_error("the " + info().architecture + " model has no state snapshots");
}

void Model::check_sampling_rows(const BatchPlan& plan, const SamplingBatch& sampling) {
  if (static_cast<int64_t>(sampling.rows.size()) != plan.num_logit_rows())
    throw std::invalid_argument("forward_sampled: " + std::to_string(sampling.rows.size()) + " sampling rows for " +
                                std::to_string(plan.num_logit_rows()) + " logit rows");
}

std::unique_ptr<Model> load_model(const Artifact& artifact, KvPool& kv, const ModelOptions& options) {
  const std::string architecture = artifact.architecture();
  if (options.tensor_parallel_size > 1 && !options.tensor_parallel) {
    if (!is_dense_llama_family(architecture) && !is_qwen3_5_architecture(architecture)) unsupported(architecture);
    return make_tensor_parallel_model(artifact, kv, options, load_model);
  }
  if (is_dense_llama_family(architecture)) return make_llama_model(artifact, kv, options);
  if (is_qwen3_5_architecture(architecture)) return make_qwen3_5_model(artifact, kv, options);
  unsupported(architecture);
}

KvGeometry kv_geometry(const Artifact& artifact) {
  const std::string architecture = artifact.architecture();
  if (is_qwen3_5_architecture(architecture)) {
    // Only the gated full-attention layers (and the MTP head's) keep K/V; GDN layers keep
    // per-lane state slots instead.
    const Qwen35Config cfg = read_qwen3_5_config(artifact);
    return {cfg.kv_pool_layers(), cfg.kv_heads, cfg.head_dim};
  }
  if (!is_dense_llama_family(architecture)) unsupported(architecture);
  const json::Value& c = artifact.config();
  KvGeometry g;
  g.num_kv_layers = c.get_int("num_hidden_layers", 0);
  const int64_t heads = c.get_int("num_attention_heads", 0);
  g.num_kv_heads = c.get_int("num_key_value_heads", heads);
  g.head_dim = c.get_int("head_dim", heads > 0 ? c.get_int("hidden_size", 0) / heads : 0);
  if (g.num_kv_layers <= 0 || g.num_kv_heads <= 0 || g.head_dim <= 0)
    throw std::runtime_error("config: cannot derive the KV geometry (layers, kv heads, head_dim)");
  return g;
}

}  // namespace ninfer
