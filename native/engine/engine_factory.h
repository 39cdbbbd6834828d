// Building an engine around a model: pool sizing, option resolution, model construction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace ninfer {

class ToyModel;

// Resolves max_context (0 = the model's own maximum; a request above it is capped to it).
EngineOptions resolve_options(EngineOptions options, int64_t model_max_positions);

// An engine over the weightless ToyModel (tests). `toy` receives the model for test hooks.
std::unique_ptr<Engine> make_toy_engine(int64_t vocab_size, std::vector<std::string> token_bytes,
                                        EngineOptions options, ToyModel** toy = nullptr);

// Where and how the model runs.
struct RuntimeOptions {
  int threads = 0;
  std::string device = "cpu";
  // >= 0: read only the artifact's header and make seeded random weights on the device
  // (ModelOptions::random_weights_seed), for benchmarks without a weight file.
  int64_t random_weights_seed = -1;
  // The format of those weights where the model would quantize a matrix (bf16, fp8, nvfp4;
  // ModelOptions::random_weights_dtype): the dtype a header-only artifact was written for.
  std::string random_weights_dtype = "bf16";
  // Ranks of tensor parallelism (ModelOptions::tensor_parallel_size); 1 = none.
  int tensor_parallel_size = 1;
};
// An engine over the artifact's model; options.eos_ids empty = the artifact's
// tokenizer.eos_token_ids. Throws ArtifactError / std::runtime_error with the reason.
std::unique_ptr<Engine> open_engine(const std::string& artifact_path, EngineOptions options,
                                    std::vector<std::string> token_bytes,
                                    const RuntimeOptions& runtime);

}  // namespace ninfer
