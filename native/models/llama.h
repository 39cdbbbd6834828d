// Dense decoder-only transformers of the Llama family: Llama, Qwen2 (q/k/v bias) and Qwen3
// (per-head RMSNorm of q and k before RoPE), written once against the Backend op set.
#pragma once

#include <memory>

#include "models/model.h"

namespace ninfer {

std::unique_ptr<Model> make_llama_model(const Artifact& artifact, KvPool& kv, const ModelOptions& options);

}  // namespace ninfer
