// Building an engine over a .ninfer artifact (kept apart from the toy factory so that the
// artifact and model registry are only linked where they are needed).
#include <algorithm>
#include <climits>
#include <string>
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

// --lm-head-draft: the tokens the proposal head scores beside its lowest ids, so that rounds
// which end a turn, close thinking or open a tool call can accept there: the EOS ids and every
// token the tokenizer adds (Qwen's control and special tokens sit above the vocabulary's merges).
// Capped: a tokenizer with thousands of added tokens keeps the lowest kMaxProposalExtras (and EOS).
constexpr size_t kMaxProposalExtras = 256;

std::vector<int32_t> proposal_extra_ids(const Artifact& artifact, const std::vector<int32_t>& eos_ids) {
  std::vector<int32_t> ids;
  if (artifact.has_resource("tokenizer.json")) {
    try {
      const json::Value document = json::Value::parse(artifact.resource("tokenizer.json"));
      const json::Value& added = document["added_tokens"];
      if (added.is_array())
        for (const auto& token : added.as_array())
          if (token["id"].is_number()) ids.push_back(static_cast<int32_t>(token["id"].as_int()));
    } catch (const std::exception&) {
      // A tokenizer the engine cannot read only leaves the proposal head at its prefix.
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (ids.size() > kMaxProposalExtras) ids.resize(kMaxProposalExtras);
  ids.insert(ids.end(), eos_ids.begin(), eos_ids.end());  // always, whatever the cap (the model dedups)
  return ids;
}

constexpr int64_t kMiB = int64_t{1} << 20;

// --kv-capacity auto: the pool takes the memory the weights, workspaces and snapshot slots
// leave (measured when the backend attaches the pool, after all of them), less the headroom
// and, on CUDA, the graph driver-state allowance (64 MiB + 4 MiB per decode-graph batch size).
// On the CPU it takes at most half of the available RAM and at most four lanes' worth of
// ceilings per lane (the pool fills lazily, but a CPU server shares the machine).
KvPool::Sizer auto_kv_sizer(const EngineOptions& options, const std::string& device) {
  const bool cpu = device == "cpu";
  const int64_t ceiling_pages = (static_cast<int64_t>(options.max_context) + kPageTokens - 1) / kPageTokens;
  const int64_t headroom = options.vram_headroom_mib * kMiB;
  const int64_t graphs = (64 + 4 * static_cast<int64_t>(options.max_concurrency)) * kMiB;
  const int64_t cpu_cap = 4 * kv_pages_for(options);
  return [=](int64_t available, int64_t page_bytes) {
    const int64_t budget = cpu ? available / 2 - headroom : available - headroom - graphs;
    int64_t pages = std::max<int64_t>(budget, 0) / std::max<int64_t>(page_bytes, 1);
    if (cpu) pages = std::min(pages, cpu_cap);
    if (pages < ceiling_pages)
      throw std::runtime_error(
          "not enough memory for the KV pool: " + std::to_string(available / kMiB) + " MiB available on " + device +
          ", " + std::to_string(options.vram_headroom_mib) + " MiB headroom, but one " +
          std::to_string(options.max_context) + "-token context needs " +
          std::to_string(ceiling_pages * page_bytes / kMiB + 1) +
          " MiB; lower --max-context or --vram-headroom-mib, or set --kv-capacity");
    return std::min<int64_t>(pages, INT32_MAX / kPageTokens);
  };
}

}  // namespace

std::unique_ptr<Engine> open_engine(const std::string& artifact_path, EngineOptions options,
                                    std::vector<std::string> token_bytes, const RuntimeOptions& runtime) {
  std::shared_ptr<const Artifact> artifact = Artifact::open(artifact_path);
  if (options.eos_ids.empty()) options.eos_ids = artifact_eos_ids(*artifact);
  options = resolve_options(std::move(options), artifact->config().get_int("max_position_embeddings", 0));
  if (options.spec.max_batch < 0) options.spec.max_batch = artifact->config().get_int("num_experts", 0) > 0 ? 3 : 0;
  if (options.max_concurrency < 1 || options.max_concurrency > 8)
    throw std::invalid_argument("max_concurrency must be between 1 and 8, got " +
                                std::to_string(options.max_concurrency));
  options = resolve_cache_defaults(std::move(options));
  const KvGeometry geometry = kv_geometry(*artifact);
  const bool explicit_capacity = options.kv_capacity > 0;
  auto pool = std::make_unique<KvPool>(explicit_capacity ? (options.kv_capacity + kPageTokens - 1) / kPageTokens : 1,
                                       geometry.num_kv_layers, geometry.num_kv_heads, geometry.head_dim,
                                       options.kv_dtype);
  if (!explicit_capacity) pool->set_sizer(auto_kv_sizer(options, runtime.device));
  ModelOptions model_options;
  model_options.snapshot_slots = options.prefix_reuse ? options.snapshot_slots : 0;
  model_options.max_lanes = options.max_concurrency;
  // A speculative round feeds each decoding lane its last token plus its proposals.
  const int32_t verify = 1 + options.spec.max_drafts();
  model_options.max_batch_tokens = options.prefill_chunk + options.max_concurrency * verify;
  model_options.max_verify_tokens = options.spec.enabled() ? verify : 0;
  model_options.proposal_vocab = options.spec.mtp_draft_tokens > 0 ? options.spec.lm_head_draft_tokens : 0;
  if (model_options.proposal_vocab > 0) model_options.proposal_extra_ids = proposal_extra_ids(*artifact, options.eos_ids);
  model_options.threads = runtime.threads;
  model_options.device = runtime.device;
  model_options.random_weights_seed = runtime.random_weights_seed;
  model_options.random_weights_dtype = runtime.random_weights_dtype;
  model_options.tensor_parallel_size = runtime.tensor_parallel_size;
  auto model = load_model(*artifact, *pool, model_options);
  return std::make_unique<Engine>(std::move(pool), std::move(model), std::move(options), std::move(token_bytes),
                                  std::move(artifact));
}

}  // namespace ninfer
