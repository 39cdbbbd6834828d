// The tensor-parallel collective group over NCCL (parallel/collective.h): one rank per CUDA
// device, all threads of this process (ncclCommInitAll). libnccl is opened at run time, like
// cuBLAS: the nvidia-nccl-cu13 wheel's lib/libnccl.so.2, NINFER_NCCL_LIBRARY, or the loader's
// search path.
//
// Not wired into --tensor-parallel-size yet and never run: it was written and compiled on a
// machine with no multi-GPU device (see docs/tensor-parallel.md).
#pragma once

#include <memory>
#include <vector>

#include "parallel/collective.h"

namespace ninfer::cuda {

// Element i is the rank on devices[i]; each must be used by one thread (it sets its device
// before every call). Buffers are device memory on the rank's device. A collective runs on the
// rank's own stream and returns once it completed there, so callers synchronize their own
// stream before it (the models do: Backend::synchronize) and may read the result right after.
std::vector<std::unique_ptr<Collective>> make_nccl_collective_group(const std::vector<int>& devices);

}  // namespace ninfer::cuda
