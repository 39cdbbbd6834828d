// Y[m, n] = X[m, k] · W[n, k]^T (+ bias): the weight-streaming op that dominates decode.
//
// Work is split over output columns (weight rows) so each thread streams a disjoint slice of
// the weights exactly once; for prefill, rows of X are processed in blocks so a weight chunk
// is reused from cache across the block. Q8_0 weights meet X quantized to int8 blocks.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/cpu/cpu_backend.h"

namespace ninfer::cpu {

namespace {

constexpr int64_t kRowBlock = 64;            // X rows per task: keeps the X block in L2
constexpr int64_t kChunkBytes = 32 * 1024;   // weight bytes per task at most (L1/L2 resident)

int64_t columns_per_task(int64_t m, int64_t n, int64_t weight_row_bytes, int threads) {
  if (m <= 2) {
    // Decode: no weight reuse across X rows, so hand each thread long contiguous runs that the
    // kernels' software prefetch can stream through; two per thread absorb uneven progress.
    const int64_t chunk = std::max<int64_t>(16, (n + 2 * threads - 1) / (2 * threads));
    return (chunk + 3) / 4 * 4;
  }
  const int64_t by_cache = std::max<int64_t>(4, kChunkBytes / std::max<int64_t>(weight_row_bytes, 1));
  const int64_t by_balance = std::max<int64_t>(4, n / (static_cast<int64_t>(threads) * 4));
  const int64_t chunk = std::min(by_cache, by_balance);
  return (chunk + 3) / 4 * 4;
}

}  // namespace

void CpuBackend::matmul(const float* x, int64_t m, const Weight& w, const float* bias, float* y) {
  const int64_t n = w.rows, k = w.cols;
  if (m <= 0 || n <= 0) return;
  const CpuKernels& kernels = cpu_kernels();
  const int64_t w_row_bytes = row_bytes(w.dtype, k);

  const BlockQ8Act* xq = nullptr;
  const int64_t blocks_per_row = k / kQ8BlockSize;
  if (w.dtype == DType::Q8_0) {
    quantized_x_.resize(static_cast<size_t>(m * blocks_per_row));
    BlockQ8Act* dst = quantized_x_.data();
    pool_.parallel_ranges(m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) kernels.quantize_row_q8(x + i * k, k, dst + i * blocks_per_row);
    });
    xq = dst;
  }
  MatmulTileF32 tile = nullptr;
  switch (w.dtype) {
    case DType::F32: tile = kernels.tile_f32; break;
    case DType::F16: tile = kernels.tile_f16; break;
    case DType::BF16: tile = kernels.tile_bf16; break;
    case DType::Q8_0: break;
    case DType::I32: throw std::invalid_argument("matmul: i32 weights are not supported");
  }

  const int64_t cols = columns_per_task(m, n, w_row_bytes, pool_.size());
  const int64_t col_tasks = (n + cols - 1) / cols;
  const int64_t row_tasks = (m + kRowBlock - 1) / kRowBlock;
  const auto* w_bytes = static_cast<const uint8_t*>(w.data);
  pool_.parallel_for(col_tasks * row_tasks, [&](int64_t task) {
    // Consecutive tasks share a weight chunk, so a thread tends to find it still cached.
    const int64_t c0 = (task / row_tasks) * cols, r0 = (task % row_tasks) * kRowBlock;
    const int64_t nc = std::min(cols, n - c0), nr = std::min(kRowBlock, m - r0);
    const uint8_t* wc = w_bytes + c0 * w_row_bytes;
    float* yc = y + r0 * n + c0;
    if (xq)
      kernels.tile_q8_0(xq + r0 * blocks_per_row, blocks_per_row, nr, wc, w_row_bytes, nc, k, yc, n);
    else
      tile(x + r0 * k, k, nr, wc, w_row_bytes, nc, k, yc, n);
    if (bias)
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) yc[i * n + j] += bias[c0 + j];
  });
}

}  // namespace ninfer::cpu
