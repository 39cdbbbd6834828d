// Launcher of the sampling kernel (see launchers_sampling.h).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_sampling.cuh"
#include "backends/cuda/launchers_sampling.h"

namespace ninfer::cuda {

void launch_sample_rows(const SampleRowsArgs& args, int rows, cudaStream_t stream) {
  if (rows <= 0) return;
  kernels::sample_rows_kernel<<<rows, kernels::kSampleThreads, 0, stream>>>(args);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
