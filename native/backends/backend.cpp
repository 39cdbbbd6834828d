#include "backends/backend.h"

#include <stdexcept>
#include <string>

namespace ninfer {

Weight Backend::random_weight(int64_t, int64_t, uint64_t, float) {
  throw std::runtime_error("the " + name() + " backend cannot make random weights");
}

#ifndef NINFER_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int) {
  throw std::runtime_error("device 'cuda' is not available: this build has no CUDA backend");
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  if (device == "cuda") return make_cuda_backend(0);
  if (device.rfind("cuda:", 0) == 0) {
    const std::string index = device.substr(5);
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos && index.size() < 6)
      return make_cuda_backend(std::stoi(index));
  }
  throw std::runtime_error("unknown device '" + device + "' (expected cpu, cuda or cuda:N)");
}

}  // namespace ninfer
