// Error checking for CUDA runtime calls and kernel launches: every failure becomes an
// exception naming the call and the place, never a silent wrong result.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "backends/device_error.h"

namespace ninfer::cuda {

// Out of memory stays an ordinary exception (the engine fails the unit's requests and carries
// on); every other CUDA error is a DeviceFatalError: the context is unusable from here on.
[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  const std::string message = std::string("CUDA_CHECK(") + what + ") failed: " + cudaGetErrorName(err) + " (" +
                              cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line);
  if (err == cudaErrorMemoryAllocation) throw std::runtime_error(message);  // "... (out of memory) ..."
  throw DeviceFatalError(message);
}

}  // namespace ninfer::cuda

#define NINFER_CUDA_CHECK(call)                                                       \
  do {                                                                                \
    const cudaError_t ninfer_err_ = (call);                                           \
    if (ninfer_err_ != cudaSuccess) ::ninfer::cuda::throw_cuda_error(ninfer_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define NINFER_CUDA_CHECK_LAUNCH() NINFER_CUDA_CHECK(cudaGetLastError())
