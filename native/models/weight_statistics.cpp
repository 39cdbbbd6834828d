#include "models/weight_statistics.h"

#include <map>
#include <string>
#include <string_view>

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

void add_random_weight_statistics(ModelInfo& info, DType dtype, int64_t rows, int64_t cols) {
  const auto rank = [](std::string_view format) {
    return format.empty() ? -1 : format == "f32" ? 0 : format == "bf16" ? 1 : 2;
  };
  const std::string_view format = dtype_name(dtype);
  info.num_params += rows * cols;
  info.weight_bytes += row_bytes(dtype, cols) * rows;
  if (rank(format) > rank(info.weight_format)) info.weight_format = std::string(format);
}

}  // namespace ninfer
