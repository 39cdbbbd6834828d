// Error checking for CUDA runtime calls and kernel launches: every failure becomes an
// exception naming the call and the place, never a silent wrong result.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace ninfer::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error: ") + what + " failed with " + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace ninfer::cuda

#define NINFER_CUDA_CHECK(call)                                                       \
  do {                                                                                \
    const cudaError_t ninfer_err_ = (call);                                           \
    if (ninfer_err_ != cudaSuccess) ::ninfer::cuda::throw_cuda_error(ninfer_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define NINFER_CUDA_CHECK_LAUNCH() NINFER_CUDA_CHECK(cudaGetLastError())
