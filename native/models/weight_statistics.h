// Facts about an artifact's weights that every architecture reports in ModelInfo.
#pragma once

#include "models/model.h"

namespace ninfer {

// Sets info.num_params, info.weight_bytes and info.weight_format (the dtype holding the most
// payload bytes) from every tensor of the artifact.
void add_weight_statistics(const Artifact& artifact, ModelInfo& info);

}  // namespace ninfer
