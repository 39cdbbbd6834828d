#include "parallel/tensor_slices.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "common/dtype.h"

namespace ninfer {

namespace {

bool element_wise(DType dtype) { return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16; }

[[noreturn]] void cannot_split(const TensorView& tensor, const char* how) {
  throw std::runtime_error("tensor parallel cannot split '" + tensor.name + "' (" + std::string(dtype_name(tensor.dtype)) + ") " +
                           how + "; use an f32, f16 or bf16 artifact");
}

}  // namespace

int64_t TensorPart::kept_rows(int64_t total) const {
  if (rows.empty()) return total;
  int64_t kept = 0;
  for (const auto& r : rows) kept += r.count;
  return kept;
}

int64_t TensorPart::kept_columns(int64_t total) const { return columns.count > 0 ? columns.count : total; }

const TensorView& TensorPart::select(TensorSlices& slices, const TensorView& tensor) const {
  if (!rows.empty()) return slices.rows(tensor, rows);
  if (columns.count > 0) return slices.columns(tensor, columns.begin, columns.count);
  return tensor;
}

const TensorView& TensorSlices::keep(const TensorView& tensor, std::vector<int64_t> shape,
                                     std::vector<std::byte> bytes) {
  data_.push_back(std::move(bytes));
  TensorView view;
  view.name = tensor.name;
  view.dtype = tensor.dtype;
  view.shape = std::move(shape);
  view.nbytes = data_.back().size();
  view.data = data_.back().data();
  view.group_rows = view.shape.size() >= 2 ? view.shape[0] : 1;
  views_.push_back(std::move(view));
  return views_.back();
}

const TensorView& TensorSlices::rows(const TensorView& tensor, const std::vector<RowRange>& ranges) {
  if (!element_wise(tensor.dtype) && tensor.dtype != DType::Q8_0) cannot_split(tensor, "by rows");
  if (tensor.shape.empty() || tensor.shape.size() > 2) cannot_split(tensor, "(not 1-D or 2-D)");
  const bool vector = tensor.shape.size() == 1;
  const int64_t total_rows = tensor.shape[0];
  const int64_t row = vector ? row_bytes(tensor.dtype, 1) : row_bytes(tensor.dtype, tensor.shape[1]);
  int64_t kept = 0;
  for (const auto& r : ranges) {
    if (r.begin < 0 || r.count < 0 || r.begin + r.count > total_rows)
      throw std::runtime_error("tensor parallel: rows [" + std::to_string(r.begin) + ", " +
                               std::to_string(r.begin + r.count) + ") are outside '" + tensor.name + "'");
    kept += r.count;
  }
  std::vector<std::byte> bytes(static_cast<size_t>(kept * row));
  std::byte* out = bytes.data();
  const auto* src = static_cast<const std::byte*>(tensor.data);
  for (const auto& r : ranges) {
    std::memcpy(out, src + r.begin * row, static_cast<size_t>(r.count * row));
    out += r.count * row;
  }
  std::vector<int64_t> shape = vector ? std::vector<int64_t>{kept} : std::vector<int64_t>{kept, tensor.shape[1]};
  return keep(tensor, std::move(shape), std::move(bytes));
}

const TensorView& TensorSlices::columns(const TensorView& tensor, int64_t begin, int64_t count) {
  if (!element_wise(tensor.dtype)) cannot_split(tensor, "by columns");
  if (tensor.shape.size() != 2) cannot_split(tensor, "by columns (not 2-D)");
  const int64_t rows = tensor.shape[0], cols = tensor.shape[1];
  if (begin < 0 || count < 0 || begin + count > cols)
    throw std::runtime_error("tensor parallel: columns outside '" + tensor.name + "'");
  const int64_t element = row_bytes(tensor.dtype, 1);
  std::vector<std::byte> bytes(static_cast<size_t>(rows * count * element));
  const auto* src = static_cast<const std::byte*>(tensor.data);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(bytes.data() + r * count * element, src + (r * cols + begin) * element,
                static_cast<size_t>(count * element));
  return keep(tensor, {rows, count}, std::move(bytes));
}

}  // namespace ninfer
