// A model run tensor-parallel by ranks that are threads of this process: one copy of the
// architecture per rank, each owning its shard of the weights, its own backend and its own
// KV pool (its heads of every page), joined by a collective group. The engine sees one Model:
// its pages are the engine pool's ids, valid in every rank's pool; rank 0's logits are the
// result (every rank computes them identically after the vocabulary all-gather).
#pragma once

#include <functional>
#include <memory>

#include "models/model.h"

namespace ninfer {

// Builds the model of one rank (options.tensor_parallel is set; its KvPool holds the rank's
// heads): the architecture's ordinary constructor.
using RankModelFactory = std::function<std::unique_ptr<Model>(const Artifact&, KvPool&, const ModelOptions&)>;

// options.tensor_parallel_size ranks on options.device (the CPU; each rank gets its share of
// options.threads). `pool` is the engine's pool: page bookkeeping only, sized here (its
// storage stays unattached; the ranks' pools hold the memory).
std::unique_ptr<Model> make_tensor_parallel_model(const Artifact& artifact, KvPool& pool, const ModelOptions& options,
                                                  const RankModelFactory& make_rank);

}  // namespace ninfer
