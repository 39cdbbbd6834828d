// Building an engine over a .ninfer artifact (kept apart from the toy factory so that the
// artifact and model registry are only linked where they are needed).
#include <algorithm>
#include <stdexcept>

#include "artifact/artifact.h"
#include "engine/engine_factory.h"

namespace ninfer {

namespace {

std::vector<int32_t> artifact_eos_ids(const Artifact& artifact) {
  std::vector<int32_t> ids;
  const json::Value& tokenizer = artifact.header()["tokenizer"];
  const json::Value& list = tokenizer["eos_token_ids"];
  if (list.is_array()) {
    for (const auto& v : list.as_array()) ids.push_back(static_cast<int32_t>(v.as_int()));
  }
  return ids;
}

}  // namespace

std::unique_ptr<Engine> open_engine(const std::string& artifact_path, EngineOptions options,
                                    std::vector<std::string> token_bytes, const RuntimeOptions& runtime) {
  std::shared_ptr<const Artifact> artifact = Artifact::open(artifact_path);
  if (options.eos_ids.empty()) options.eos_ids = artifact_eos_ids(*artifact);
  options = resolve_options(std::move(options), artifact->config().get_int("max_position_embeddings", 0));
  if (options.max_concurrency < 1 || options.max_concurrency > 8)
    throw std::invalid_argument("max_concurrency must be between 1 and 8, got " +
                                std::to_string(options.max_concurrency));
  const KvGeometry geometry = kv_geometry(*artifact);
  auto pool = std::make_unique<KvPool>(kv_pages_for(options), geometry.num_kv_layers, geometry.num_kv_heads,
                                       geometry.head_dim);
  ModelOptions model_options;
  model_options.max_lanes = options.max_concurrency;
  // A speculative round feeds each decoding lane its last token plus its proposals.
  const int32_t verify = 1 + options.spec.max_drafts();
  model_options.max_batch_tokens = options.prefill_chunk + options.max_concurrency * verify;
  model_options.max_verify_tokens = options.spec.enabled() ? verify : 0;
  model_options.threads = runtime.threads;
  model_options.device = runtime.device;
  auto model = load_model(*artifact, *pool, model_options);
  return std::make_unique<Engine>(std::move(pool), std::move(model), std::move(options), std::move(token_bytes),
                                  std::move(artifact));
}

}  // namespace ninfer
