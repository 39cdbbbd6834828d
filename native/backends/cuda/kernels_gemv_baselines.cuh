// Baseline GEMV kernels kept for one benchmark round against the stream-K GEMV of
// kernels_gemv.cuh (bench/bench_cuda_gemv.py): the block-split tensor-core kernel (a block
// owns 8·kRowTiles rows over all k, its warps split k and reduce through shared memory; the
// grid is one block per row group, so the last partial wave of blocks leaves most SMs idle)
// and the CUDA-core kernel it replaced.
#pragma once

#include "backends/cuda/kernels_gemv.cuh"

namespace ninfer::cuda::kernels {

// Block-split: kWide as for gemv_bf16_stream_k.
template <typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads)
    gemv_bf16_block_split(const GemvJobTable table, const float* __restrict__ x, int m, int k) {
  constexpr int kRowTiles = Shape::kRowTiles, kWarps = Shape::kWarps, kUnroll = Shape::kUnroll;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = lane >> 2, tig = lane & 3;
  int job = 0;
  while (static_cast<int>(blockIdx.x) >= table.first_block[job + 1]) ++job;
  const int rows = table.rows[job];
  const int row0 = (static_cast<int>(blockIdx.x) - table.first_block[job]) * Shape::kBlockRows;

  // This lane's weight rows (rows past the end re-read the last row: valid memory, not stored)
  // and x rows (rows past m read as zeros), each at the lane's 8 k of a chunk.
  const uint16_t* w_lane[kRowTiles];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
    w_lane[t] = table.w[job] + static_cast<int64_t>(min(row0 + 8 * t + group, rows - 1)) * k + 8 * tig;
  const bool x_lo_live = group < m, x_hi_live = kWide && group + 8 < m;
  const float* x_lo = x + static_cast<int64_t>(min(group, m - 1)) * k + 8 * tig;
  const float* x_hi = x + static_cast<int64_t>(min(group + 8, m - 1)) * k + 8 * tig;

  float acc[kRowTiles][4];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

  auto step = [&](const uint4 (&w)[kRowTiles], const uint4& lo, const uint4& hi) {
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
      mma_m16n8k16_bf16(acc[t], lo.x, hi.x, lo.y, hi.y, w[t].x, w[t].y);
      mma_m16n8k16_bf16(acc[t], lo.z, hi.z, lo.w, hi.w, w[t].z, w[t].w);
    }
  };
  constexpr uint4 kZero = {0u, 0u, 0u, 0u};

  // Full batches: kWarps * kUnroll chunks of 32 k, no bounds checks.
  const int full_chunks = k / 32;
  constexpr int kBatch = kWarps * kUnroll;
  uint4 w[kUnroll][kRowTiles];
  auto load_batch_weights = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t)
        w[u][t] = load_weights16<Shape::kLoad>(w_lane[t] + 32 * int64_t(base + u * kWarps + warp));
  };
  // The weights depend on no earlier kernel: the first batch streams in while the previous
  // kernel (launched with programmatic serialization) may still run; x and y only after it.
  allow_dependent_launch();
  if (kBatch <= full_chunks) load_batch_weights(0);
  wait_for_prerequisite_grids();
  int base = 0;
  for (; base + kBatch <= full_chunks; base += kBatch) {
    if (base > 0) load_batch_weights(base);
    uint4 lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t offset = 32 * (base + u * kWarps + warp);
      lo[u] = x_lo_live ? load_x8_bf16(x_lo + offset) : kZero;
      hi[u] = x_hi_live ? load_x8_bf16(x_hi + offset) : kZero;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) step(w[u], lo[u], hi[u]);
  }
  // The rest, chunk by chunk; a lane whose 8 k lie past k contributes zeros.
  for (int q = base + warp; 32 * q < k; q += kWarps) {
    const int64_t offset = 32 * q;
    const bool live = offset + 8 * tig + 8 <= k;
    uint4 wt[kRowTiles];
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) wt[t] = live ? load_weights16<Shape::kLoad>(w_lane[t] + offset) : kZero;
    const uint4 lo = live && x_lo_live ? load_x8_bf16(x_lo + offset) : kZero;
    const uint4 hi = live && x_hi_live ? load_x8_bf16(x_hi + offset) : kZero;
    step(wt, lo, hi);
  }

  // acc[t] = {y[g][r], y[g][r + 1], y[g + 8][r], y[g + 8][r + 1]} with r = row0 + 8t + 2·tig:
  // the warps' partial sums meet in shared memory and are added in warp order.
  float* y = table.y[job];
  const float* bias = table.bias[job];
  constexpr int kValues = kRowTiles * 4 * 32;
  __shared__ float partial[kWarps][kValues];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][(t * 4 + i) * 32 + lane] = acc[t][i];
  __syncthreads();
  // One thread per (x row, weight row) of the block; consecutive threads, consecutive rows.
  for (int idx = threadIdx.x; idx < 16 * Shape::kBlockRows; idx += Shape::kThreads) {
    const int n = idx / Shape::kBlockRows, r = idx % Shape::kBlockRows, row = row0 + r;
    if (n >= m || row >= rows) continue;
    const int value = ((r / 8) * 4 + (n >= 8 ? 2 : 0) + (r & 1)) * 32 + (n & 7) * 4 + (r & 7) / 2;
    float sum = partial[0][value];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += partial[w][value];
    if (bias) sum += bias[row];
    float* out = y + static_cast<int64_t>(n) * rows + row;
    *out = table.accumulate ? *out + sum : sum;
  }
}

// --- the previous CUDA-core GEMV, kept for one benchmark round as the baseline -------------

inline constexpr int kGemvRowsPerWarp = 4;
inline constexpr int kGemvWarpsPerBlock = 8;

struct GemvLegacyTable {
  const uint16_t* w[4];
  const float* bias[4];
  float* y[4];
  int32_t rows[4];
  int32_t first_warp[5];
  int32_t num_jobs;
};

template <int M>
__global__ void __launch_bounds__(kGemvWarpsPerBlock * 32)
    gemv_bf16_legacy(const GemvLegacyTable table, const float* __restrict__ x, int k) {
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
