// bf16-weight GEMV for decode-sized batches: y[m, n] = x[m, k] · W[n, k]^T with m <= 16.
//
// The weight streams from memory once; each warp owns kRowsPerWarp consecutive weight rows
// and walks k with 16-byte loads (8 bf16 per lane, 256 values per warp step), so each x
// value loaded (from L1/L2, x is small) serves kRowsPerWarp rows. Several weights of the
// same width (q/k/v, gate/up) are served by one launch through a job table.
#pragma once

#include "backends/cuda/kernels_common.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kGemvRowsPerWarp = 4;
inline constexpr int kGemvWarpsPerBlock = 8;

struct GemvJobTable {
  const uint16_t* w[4];
  const float* bias[4];
  float* y[4];
  int32_t rows[4];
  int32_t first_warp[5];  // prefix sums of warps per job
  int32_t num_jobs;
};

template <int M>
__global__ void __launch_bounds__(kGemvWarpsPerBlock * 32)
    gemv_bf16(const GemvJobTable table, const float* __restrict__ x, int k) {
  const int warp = blockIdx.x * kGemvWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (warp >= table.first_warp[table.num_jobs]) return;
  int job = 0;
  while (warp >= table.first_warp[job + 1]) ++job;
  const int rows = table.rows[job];
  const int row0 = (warp - table.first_warp[job]) * kGemvRowsPerWarp;
  const uint16_t* w = table.w[job];

  float acc[M][kGemvRowsPerWarp];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) acc[m][r] = 0.0f;

  // Rows past the end re-read the last row (valid memory) and are not written.
  const uint16_t* wr[kGemvRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) wr[r] = w + static_cast<int64_t>(min(row0 + r, rows - 1)) * k;

#pragma unroll 2
  for (int c = lane * 8; c < k; c += 256) {
    uint4 packed[kGemvRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) packed[r] = __ldg(reinterpret_cast<const uint4*>(wr[r] + c));
    float wf[kGemvRowsPerWarp][8];
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) bf16x8_to_float(packed[r], wf[r]);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(m) * k + c));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(m) * k + c + 4));
      // x rounded to bf16 like the cuBLAS path's input, so results do not depend on which
      // path (and so which batch size) computed them.
      const float xs[8] = {round_bf16(x0.x), round_bf16(x0.y), round_bf16(x0.z), round_bf16(x0.w),
                           round_bf16(x1.x), round_bf16(x1.y), round_bf16(x1.z), round_bf16(x1.w)};
#pragma unroll
      for (int r = 0; r < kGemvRowsPerWarp; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(wf[r][j], xs[j], acc[m][r]);
    }
  }

  const float* bias = table.bias[job];
  float* y = table.y[job];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      const float v = warp_sum(acc[m][r]);
      if (lane == ((m * kGemvRowsPerWarp + r) & 31) && row0 + r < rows)
        y[static_cast<int64_t>(m) * rows + row0 + r] = v + (bias ? bias[row0 + r] : 0.0f);
    }
}

}  // namespace ninfer::cuda::kernels
