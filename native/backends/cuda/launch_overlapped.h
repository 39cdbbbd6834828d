// Kernel launches that may overlap the previous kernel of the stream (programmatic dependent
// launch, sm_90): with `overlap`, the kernel can start once the previous kernel has called
// allow_dependent_launch() (kernels_common.cuh), and must call wait_for_prerequisite_grids()
// before it touches memory an earlier kernel writes or reads.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"

namespace ninfer::cuda {

template <typename... Params, typename... Args>
void launch_overlapped(bool overlap, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       void (*kernel)(Params...), Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (overlap) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  NINFER_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

}  // namespace ninfer::cuda
