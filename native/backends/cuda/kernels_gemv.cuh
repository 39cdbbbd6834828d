// bf16-weight GEMV for decode-sized batches on tensor cores: y[m, n] = x[m, k] · W[n, k]^T
// (+ bias, + the old y when accumulating) with m <= 16.
//
// The product is memory-bound: each weight byte is read once and all that matters is keeping
// enough 16-byte loads in flight on every SM until the very end. One mma.sync m16n8k16 takes
// x (up to 16 rows, the A operand) against 8 weight rows (the B operand) over 16 k. Because a
// dot product does not care in which order k is summed, k is permuted identically in both
// operands so that each lane's B fragment of two consecutive mmas is one 16-byte load of 8
// consecutive weights (and its A fragment 8 consecutive x values):
//   mma 0: logical k {2t, 2t+1, 2t+8, 2t+9} <- physical k 8t + {0, 1, 2, 3}
//   mma 1: the same logical k                <- physical k 8t + {4, 5, 6, 7}
// for the lane's thread-in-group t (lane % 4); the lane's group g (lane / 4) picks its weight
// row and its x rows (g and g + 8). So a warp covers 8 weight rows × 32 k per pair of mmas.
//
// A block owns kRowTiles × 8 weight rows over the whole k; its warps split k into 32-wide
// chunks, interleaved (chunk q goes to warp q % kWarps) so that at any moment the block reads
// one contiguous stretch of each row, and reduce their partial sums through shared memory in
// a fixed order (deterministic results). x is read as f32 from L1/L2 (it is small and shared
// by every block) and rounded to bf16 like the cuBLAS path's input, so results do not depend
// on which path (and so which batch size) computed them; products accumulate in f32.
//
// Several weights of the same width (q/k/v, gate/up) are served by one launch through a job
// table.
#pragma once

#include "backends/cuda/kernels_common.cuh"

namespace ninfer::cuda::kernels {

struct GemvJobTable {
  const uint16_t* w[4];
  const float* bias[4];
  float* y[4];
  int32_t rows[4];
  int32_t first_block[5];  // prefix sums of blocks per job
  int32_t num_jobs;
  int32_t accumulate;      // y += x · W^T (+ bias) instead of y = ...
};

// How a weight is loaded: streamed past L1 (which keeps x), optionally prefetching the
// surrounding 256 bytes into L2; or a plain read-only load.
enum class WeightLoad { StreamPrefetch, Stream, ReadOnly };

template <WeightLoad kLoad>
__device__ __forceinline__ uint4 load_weights16(const uint16_t* p) {
  uint4 v;
  if constexpr (kLoad == WeightLoad::StreamPrefetch) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  } else if constexpr (kLoad == WeightLoad::Stream) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  } else {
    v = __ldg(reinterpret_cast<const uint4*>(p));
  }
  return v;
}

// Two floats as bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}

// 8 consecutive f32 x values as 8 bf16.
__device__ __forceinline__ uint4 load_x8_bf16(const float* p) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p + 4));
  return {pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w)};
}

// d += A (16×16 bf16, row-major) · B (16×8 bf16, column-major), f32 accumulators.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The compile-time shape of one GEMV kernel: kRowTiles tiles of 8 weight rows per block,
// kWarps warps splitting k, kUnroll 32-wide chunks per warp loaded before any is used.
template <int kRowTiles_, int kWarps_, int kUnroll_, WeightLoad kLoad_ = WeightLoad::StreamPrefetch>
struct GemvShape {
  static constexpr int kRowTiles = kRowTiles_, kWarps = kWarps_, kUnroll = kUnroll_;
  static constexpr WeightLoad kLoad = kLoad_;
  static constexpr int kBlockRows = 8 * kRowTiles;
  static constexpr int kThreads = 32 * kWarps;
};

// kWide: m > 8, so x rows 8..15 (the upper half of the A fragment) are live.
template <typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads)
    gemv_bf16_mma(const GemvJobTable table, const float* __restrict__ x, int m, int k) {
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
  int base = 0;
  for (; base + kBatch <= full_chunks; base += kBatch) {
    uint4 w[kUnroll][kRowTiles], lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t offset = 32 * (base + u * kWarps + warp);
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) w[u][t] = load_weights16<Shape::kLoad>(w_lane[t] + offset);
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
    uint4 w[kRowTiles];
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) w[t] = live ? load_weights16<Shape::kLoad>(w_lane[t] + offset) : kZero;
    const uint4 lo = live && x_lo_live ? load_x8_bf16(x_lo + offset) : kZero;
    const uint4 hi = live && x_hi_live ? load_x8_bf16(x_hi + offset) : kZero;
    step(w, lo, hi);
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
