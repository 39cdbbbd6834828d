#include "models/weight_statistics.h"

#include <map>
#include <string>

#include "artifact/artifact.h"

namespace ninfer {

void add_weight_statistics(const Artifact& artifact, ModelInfo& info) {
  std::map<std::string, int64_t> bytes_by_format;
  for (const auto& t : artifact.tensors()) {
    info.num_params += t.numel();
    info.weight_bytes += static_cast<int64_t>(t.nbytes);
    bytes_by_format[std::string(dtype_name(t.dtype))] += static_cast<int64_t>(t.nbytes);
  }
  int64_t best = -1;
  for (const auto& [format, bytes] : bytes_by_format)
    if (bytes > best) best = bytes, info.weight_format = format;
}

void add_random_weight_statistics(ModelInfo& info, int64_t elements, int64_t bytes, const char* format) {
  info.num_params += elements;
  info.weight_bytes += bytes;
  if (std::string(format) == "bf16" || info.weight_format.empty()) info.weight_format = format;
}

}  // namespace ninfer
