// Launcher of the sampling kernel (see launchers_sampling.h).
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_sampling.cuh"
#include "backends/cuda/launchers_sampling.h"

namespace ninfer::cuda {

int sample_cluster_blocks(int64_t vocab) {
  // A block streams about 30k logits per pass at full speed; smaller rows gain nothing from
  // spreading, larger ones use up to the portable cluster size.
  if (vocab >= 8 * 16384) return 8;
  if (vocab >= 4 * 16384) return 4;
  if (vocab >= 2 * 16384) return 2;
  return 1;
}

void launch_sample_rows(const SampleRowsArgs& args, int rows, int cluster_blocks, cudaStream_t stream) {
  if (rows <= 0) return;
  if (cluster_blocks < 1 || cluster_blocks > 16 || (cluster_blocks & (cluster_blocks - 1)) != 0)
    throw std::invalid_argument("sample_rows: cluster size must be 1, 2, 4, 8 or 16, got " +
                                std::to_string(cluster_blocks));
  if (cluster_blocks > 8)  // beyond the portable size: the device may refuse to launch it
    NINFER_CUDA_CHECK(
        cudaFuncSetAttribute(kernels::sample_rows_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned int>(rows * cluster_blocks));
  config.blockDim = dim3(kernels::kSampleThreads);
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned int>(cluster_blocks);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernels::sample_rows_kernel, args);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // a refused launch must not surface at the next kernel's check
    throw_cuda_error(err, "cudaLaunchKernelEx(sample_rows_kernel)", __FILE__, __LINE__);
  }
}

}  // namespace ninfer::cuda
