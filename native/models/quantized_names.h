// Which matrices an FP8/NVFP4 artifact stores quantized (python/ninfer/convert/tensors.py's
// `quantizable`, mirrored for weights made on the device): all but the embedding, lm_head,
// the MoE router and shared-expert gate, the GDN's a/b projections and the MTP head.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "common/dtype.h"

namespace ninfer {

inline bool quantizable_weight(std::string_view name, int64_t cols, DType dtype) {
  constexpr std::array<std::string_view, 7> kKept = {"embed_tokens.weight", "lm_head.weight", "mlp.gate.weight",
                                                     "shared_expert_gate.weight", "in_proj_a.weight",
                                                     "in_proj_b.weight", "conv1d.weight"};
  if (name.starts_with("mtp.")) return false;
  for (std::string_view kept : kKept)
    if (name.ends_with(kept)) return false;
  return quantized_shape_problem(dtype, cols).empty();
}

}  // namespace ninfer
