#include "engine/engine_factory.h"

#include <algorithm>
#include <stdexcept>

#include "models/toy_model.h"

namespace ninfer {

EngineOptions resolve_options(EngineOptions options, int64_t model_max_positions) {
  if (options.max_context < 0) throw std::invalid_argument("max_context must not be negative");
  if (options.kv_capacity < 0) throw std::invalid_argument("kv_capacity must not be negative (0 = auto)");
  if (options.vram_headroom_mib < 0) throw std::invalid_argument("vram_headroom_mib must not be negative");
  if (options.max_context == 0) {
    if (model_max_positions <= 0) throw std::invalid_argument("the model does not state its context length; set max_context");
    options.max_context = static_cast<int32_t>(std::min<int64_t>(model_max_positions, INT32_MAX));
  }
  std::sort(options.eos_ids.begin(), options.eos_ids.end());
  options.eos_ids.erase(std::unique(options.eos_ids.begin(), options.eos_ids.end()), options.eos_ids.end());
  return options;
}

std::unique_ptr<Engine> make_toy_engine(int64_t vocab_size, std::vector<std::string> token_bytes,
                                        EngineOptions options, ToyModel** toy) {
  constexpr int64_t kToyPositions = 4096;
  options = resolve_options(std::move(options), kToyPositions);
  if (options.max_concurrency < 1 || options.max_concurrency > 8)
    throw std::invalid_argument("max_concurrency must be between 1 and 8, got " +
                                std::to_string(options.max_concurrency));
  options = resolve_cache_defaults(std::move(options));
  if (options.kv_dtype != KvDType::BF16)
    throw std::invalid_argument("the toy model keeps token ids as its KV: --kv-dtype " +
                                std::string(kv_dtype_name(options.kv_dtype)) + " needs a real model");
  // The toy has no memory to measure: auto gives room for every lane at the ceiling, twice.
  const int64_t pages = options.kv_capacity > 0 ? (options.kv_capacity + kPageTokens - 1) / kPageTokens
                                                : 2 * kv_pages_for(options);
  auto pool = std::make_unique<KvPool>(pages, ToyModel::kLayers, ToyModel::kHeads, ToyModel::kHeadDim);
  auto model = std::make_unique<ToyModel>(vocab_size, *pool, options.max_concurrency,
                                          std::max<int64_t>(kToyPositions, options.max_context));
  if (toy) *toy = model.get();
  return std::make_unique<Engine>(std::move(pool), std::move(model), std::move(options), std::move(token_bytes));
}

}  // namespace ninfer
