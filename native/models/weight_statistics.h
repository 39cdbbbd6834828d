// Facts about an artifact's weights that every architecture reports in ModelInfo.
#pragma once

#include "models/model.h"

namespace ninfer {

// Sets info.num_params, info.weight_bytes and info.weight_format (the dtype holding the most
// payload bytes) from every tensor of the artifact.
void add_weight_statistics(const Artifact& artifact, ModelInfo& info);

// The same facts for a weight a backend made as random values instead (random_weights_seed):
// `elements` values stored as `format`, `bytes` in all.
void add_random_weight_statistics(ModelInfo& info, int64_t elements, int64_t bytes, const char* format);

}  // namespace ninfer
