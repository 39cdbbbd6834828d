// Parts of artifact tensors for one tensor-parallel rank: owned host copies of row ranges
// or a column range, viewed as TensorViews the backend uploads like any artifact tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "artifact/artifact.h"

namespace ninfer {

struct RowRange {
  int64_t begin = 0;
  int64_t count = 0;
};

class TensorSlices;

// The part of a tensor one rank keeps: all of it, some row ranges, or one column range.
struct TensorPart {
  std::vector<RowRange> rows;  // non-empty: these rows, in order
  RowRange columns;            // count > 0: these columns of every row

  bool whole() const { return rows.empty() && columns.count == 0; }
  int64_t kept_rows(int64_t total) const;
  int64_t kept_columns(int64_t total) const;
  // The tensor itself when whole(), else the slice (owned by `slices`).
  const TensorView& select(TensorSlices& slices, const TensorView& tensor) const;

  static TensorPart all() { return {}; }
  static TensorPart row_range(int64_t begin, int64_t count) { return {{{begin, count}}, {}}; }
  static TensorPart column_range(int64_t begin, int64_t count) { return {{}, {begin, count}}; }
};

class TensorSlices {
 public:
  // Rows `ranges` of a 2-D tensor (elements, for a 1-D one), concatenated in order. Any
  // row-wise dtype (f32, f16, bf16, q8_0); throws for block-scaled formats (fp8, nvfp4).
  const TensorView& rows(const TensorView& tensor, const std::vector<RowRange>& ranges);
  // Columns [begin, begin + count) of every row of a 2-D tensor (f32, f16, bf16 only).
  const TensorView& columns(const TensorView& tensor, int64_t begin, int64_t count);

 private:
  const TensorView& keep(const TensorView& tensor, std::vector<int64_t> shape, std::vector<std::byte> bytes);
  // deques: references handed out stay valid as more slices are added
  std::deque<std::vector<std::byte>> data_;
  std::deque<TensorView> views_;
};

}  // namespace ninfer
