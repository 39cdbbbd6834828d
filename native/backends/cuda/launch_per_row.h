// One block a row for the row-wise norm kernels: the block size and the values each thread holds
// in registers (kPerThread) are chosen here alone, so that a fused variant of a norm (which must
// reduce in the same order to produce the same bits) launches exactly as the plain one does.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

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

// Whether rows of `cols` take the vector kernels (kernels_row_norm.cuh's vec_norm_row): whole
// 128-column groups, at most 16 groups a warp, every pointer 16-byte aligned. rms_norm,
// add_rms_norm and their fused FP8 producer decide by this alone, so they stay bit for bit equal.
inline constexpr int kVecRowWarps = 8;  // kernels_row_norm.cuh's kVecNormThreads / 32
inline bool vec_norm_rows(int64_t cols, std::initializer_list<const void*> pointers) {
  if (cols <= 0 || cols % 128 != 0 || cols / 128 > 16 * kVecRowWarps) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Launches Kernel<kPerWarp> (one block of kVecRowWarps warps a row) with the smallest kPerWarp
// that holds the row's groups; needs vec_norm_rows.
template <template <int> class Kernel, typename... Args>
void per_vec_row(int64_t rows, int64_t cols, bool overlap, cudaStream_t stream, Args... args) {
  const int64_t per_warp = (cols / 128 + kVecRowWarps - 1) / kVecRowWarps;
  const dim3 grid(static_cast<unsigned int>(rows)), block(32 * kVecRowWarps);
  auto run = [&](auto kernel) { launch_overlapped(overlap, grid, block, 0, stream, kernel, args...); };
  // Registers limit the blocks resident per SM: no more groups a warp than the row needs.
  if (per_warp <= 1) return run(Kernel<1>::kernel);
  if (per_warp <= 2) return run(Kernel<2>::kernel);
  if (per_warp <= 3) return run(Kernel<3>::kernel);
  if (per_warp <= 4) return run(Kernel<4>::kernel);
  if (per_warp <= 5) return run(Kernel<5>::kernel);  // 5120 columns
  if (per_warp <= 6) return run(Kernel<6>::kernel);
  if (per_warp <= 8) return run(Kernel<8>::kernel);
  if (per_warp <= 12) return run(Kernel<12>::kernel);
  run(Kernel<16>::kernel);
}

}  // namespace ninfer::cuda
