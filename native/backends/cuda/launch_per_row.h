// One block a row for the row-wise norm kernels: the block size and the values each thread holds
// in registers (kPerThread) are chosen here alone, so that a fused variant of a norm (which must
// reduce in the same order to produce the same bits) launches exactly as the plain one does.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/launch_overlapped.h"

namespace ninfer::cuda {

inline int row_threads(int64_t cols) { return cols >= 1024 ? 1024 : (cols >= 256 ? 256 : 128); }

// Launches Kernel<kPerThread> (one block per row, `smem` bytes of dynamic shared memory) with the
// smallest kPerThread that holds a row in registers, or the looping Kernel<0> for rows wider than
// 16 values a thread.
template <template <int> class Kernel, typename... Args>
void per_row(int64_t rows, int64_t cols, bool overlap, size_t smem, cudaStream_t stream, Args... args) {
  const int threads = row_threads(cols);
  const int64_t per_thread = (cols + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned int>(rows)), block(static_cast<unsigned int>(threads));
  auto run = [&](auto kernel) { launch_overlapped(overlap, grid, block, smem, stream, kernel, args...); };
  if (per_thread <= 1) return run(Kernel<1>::kernel);
  if (per_thread <= 2) return run(Kernel<2>::kernel);
  if (per_thread <= 4) return run(Kernel<4>::kernel);
  if (per_thread <= 8) return run(Kernel<8>::kernel);
  if (per_thread <= 16) return run(Kernel<16>::kernel);
  run(Kernel<0>::kernel);
}

}  // namespace ninfer::cuda
