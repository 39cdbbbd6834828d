// Facts about an artifact's weights that every architecture reports in ModelInfo.
#pragma once

#include "backends/backend.h"
#include "models/model.h"

namespace ninfer {

// Sets info.num_params, info.weight_bytes and info.weight_format (the dtype holding the most
// payload bytes) from every tensor of the artifact.
void add_weight_statistics(const Artifact& artifact, ModelInfo& info);

// The same facts for a weight a backend made as random values instead (random_weights_seed):
// a [rows, cols] tensor stored as `dtype` (bytes: the codes; FP8/NVFP4 scales not counted).
// The format reported is the widest-used of them: block-quantized over bf16 over f32.
void add_random_weight_statistics(ModelInfo& info, DType dtype, int64_t rows, int64_t cols);
inline void add_random_weight_statistics(ModelInfo& info, const Weight& w) {
  add_random_weight_statistics(info, w.dtype, w.rows, w.cols);
}

}  // namespace ninfer
