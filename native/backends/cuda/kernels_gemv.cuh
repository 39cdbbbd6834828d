// bf16-weight GEMV for decode-sized batches on tensor cores: y[m, n] = x[m, k] · W[n, k]^T
// (+ bias, + the old y when accumulating) with m <= 16.
//
// The product is memory-bound: each weight byte is read once, and what matters is that every
// SM keeps enough 16-byte loads in flight. One mma.sync m16n8k16 takes x (up to 16 rows, the
// A operand) against 8 weight rows (the B operand) over 16 k. A dot product does not care in
// which order k is summed, so k is permuted identically in both operands and each lane's B
// fragment of two consecutive mmas is one 16-byte load of 8 consecutive weights (its A
// fragment 8 consecutive x values):
//   mma 0: logical k {2t, 2t+1, 2t+8, 2t+9} <- physical k 8t + {0, 1, 2, 3}
//   mma 1: the same logical k                <- physical k 8t + {4, 5, 6, 7}
// for the lane's thread-in-group t (lane % 4); the lane's group g (lane / 4) picks its weight
// row and its x rows (g and g + 8). A warp thus covers 8 weight rows × 32 k per pair of mmas;
// tiles of 8·kRowTiles rows are the unit of output.
//
// A block's warps split k by interleaved 32-wide chunks (warp w takes chunks w, w + kWarps,
// ...), so the block reads one contiguous stretch of each of its rows at a time (DRAM pages
// stay open), and add their partial sums through shared memory in warp order. Two ways to
// hand out the tiles (bench/bench_cuda_gemv.py times both):
// - gemv_bf16_block_split: one block per tile; the hardware schedules the blocks.
// - gemv_bf16_stream_k_blocks: a grid of as many blocks as the chip holds, each owning the
//   same number of (tile, step of kWarps·kUnroll chunks) units, so tiles of long rows (k =
//   17408: 320 tiles for 5120 rows) are shared between blocks; a shared tile's partial sums go
//   through a workspace and the last block to arrive adds them in block order.
// Both are deterministic. x is read as f32 through L1 (small, shared by every block) and
// rounded to bf16 like the cuBLAS path's input, so results do not depend on which path (and
// so which batch size) computed them; products accumulate in f32.
//
// The first batch of weights is loaded before wait_for_prerequisite_grids(): launched with
// programmatic serialization, a GEMV streams weights while the previous kernel finishes.
// Several weights of the same width (q/k/v, gate/up) are served by one launch (job table).
#pragma once

#include "backends/cuda/kernels_common.cuh"

namespace ninfer::cuda::kernels {

struct GemvJobTable {
  const uint16_t* w[4];
  const float* bias[4];
  float* y[4];
  int32_t rows[4];
  int32_t first_tile[5];  // prefix sums of row tiles per job (block split: one block a tile)
  int32_t num_jobs;
  int32_t accumulate;     // y += x · W^T (+ bias) instead of y = ...
};

// Per block of a stream-K grid: two partial tiles (the first and the last of its range) and
// one counter (of the tile whose first unit it owns). Counters are zero between launches: the
// block that completes a shared tile resets its counter.
struct GemvWorkspace {
  float* partials = nullptr;
  int32_t* counters = nullptr;
  int64_t max_blocks = 0;
};

// 16 bytes of weights, streamed past L1 (which keeps x), prefetching the surrounding 256
// bytes into L2.
__device__ __forceinline__ uint4 load_weights16(const uint16_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Two floats as bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}

// 8 consecutive f32 x values as 8 bf16, through the non-coherent path: only in kernels whose
// SASS keeps these loads below their wait (tools/pdl_sass_audit.py, which check.sh runs).
__device__ __forceinline__ uint4 load_x8_bf16(const float* p) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p + 4));
  return {pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w)};
}

// The same through coherent loads (load_activations4), for the kernels whose wait sits in a
// loop (stream-K, the general quantized GEMV): ptxas moved their __ldg loads of x above it.
__device__ __forceinline__ uint4 load_x8_bf16_coherent(const float* p) {
  const float4 a = load_activations4(p);
  const float4 b = load_activations4(p + 4);
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

// The compile-time shape of one GEMV kernel: tiles of 8·kRowTiles weight rows, kWarps warps
// a block, kUnroll chunks per warp loaded before any is used; kMinBlocks per SM for
// __launch_bounds__.
template <int kRowTiles_, int kWarps_, int kUnroll_, int kMinBlocks_ = 1>
struct GemvShape {
  static constexpr int kRowTiles = kRowTiles_, kWarps = kWarps_, kUnroll = kUnroll_, kMinBlocks = kMinBlocks_;
  static constexpr int kTileRows = 8 * kRowTiles;
  static constexpr int kThreads = 32 * kWarps;
};
inline constexpr int kGemvMaxSlotFloats = 16 * 16;  // a tile's outputs: 16 x rows × at most 16 weight rows

// One 32-wide chunk: two mmas per tile of 8 weight rows (hi is zero unless m > 8).
template <int kRowTiles>
__device__ __forceinline__ void mma_chunk(float (&acc)[kRowTiles][4], const uint4 (&w)[kRowTiles], const uint4& lo,
                                          const uint4& hi) {
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) {
    mma_m16n8k16_bf16(acc[t], lo.x, hi.x, lo.y, hi.y, w[t].x, w[t].y);
    mma_m16n8k16_bf16(acc[t], lo.z, hi.z, lo.w, hi.w, w[t].z, w[t].w);
  }
}

// The value index in a block's shared partial sums ([warp][tile · 4 + i][lane], the mma
// accumulator layout) of output (x row n, weight row r of the tile).
__device__ __forceinline__ int accumulator_index(int n, int r) {
  return ((r / 8) * 4 + (n >= 8 ? 2 : 0) + (r & 1)) * 32 + (n & 7) * 4 + (r & 7) / 2;
}

// The stream-K split: units of work numbered tile by tile, `parts` workers (warps or blocks;
// never more than units, so none is idle), worker w owns units [first_unit(w),
// first_unit(w + 1)).
struct StreamKSplit {
  int64_t parts, units;
  int per_tile;  // units per tile
  __device__ int64_t first_unit(int64_t w) const { return w * units / parts; }
  __device__ int64_t owner(int64_t u) const { return ((u + 1) * parts - 1) / units; }
};

// The job of a tile and this lane's weight rows in it, at the lane's 8 k of chunk 0 (rows past
// the end re-read the last row: valid memory, never stored).
template <int kRowTiles>
__device__ int tile_rows(const GemvJobTable& table, int tile, int k, const uint16_t* (&w_lane)[kRowTiles]) {
  const int group = (threadIdx.x & 31) >> 2, tig = threadIdx.x & 3;
  int job = 0;
  while (tile >= table.first_tile[job + 1]) ++job;
  const int rows = table.rows[job], row0 = (tile - table.first_tile[job]) * 8 * kRowTiles;
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
    w_lane[t] = table.w[job] + static_cast<int64_t>(min(row0 + 8 * t + group, rows - 1)) * k + 8 * tig;
  return job;
}

// One block per tile. kWide: m > 8, so x rows 8..15 (the upper half of the A fragment) are live.
template <typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads)
    gemv_bf16_block_split(const GemvJobTable table, const float* __restrict__ x, int m, int k) {
  constexpr int kRowTiles = Shape::kRowTiles, kWarps = Shape::kWarps, kUnroll = Shape::kUnroll;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = lane >> 2, tig = lane & 3;
  int job = 0;
  while (static_cast<int>(blockIdx.x) >= table.first_tile[job + 1]) ++job;
  const int rows = table.rows[job];
  const int row0 = (static_cast<int>(blockIdx.x) - table.first_tile[job]) * Shape::kTileRows;

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
        w[u][t] = load_weights16(w_lane[t] + 32 * int64_t(base + u * kWarps + warp));
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
    for (int u = 0; u < kUnroll; ++u) mma_chunk(acc, w[u], lo[u], hi[u]);
  }
  // The rest, chunk by chunk; a lane whose 8 k lie past k contributes zeros.
  for (int q = base + warp; 32 * q < k; q += kWarps) {
    const int64_t offset = 32 * q;
    const bool live = offset + 8 * tig + 8 <= k;
    uint4 wt[kRowTiles];
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) wt[t] = live ? load_weights16(w_lane[t] + offset) : kZero;
    const uint4 lo = live && x_lo_live ? load_x8_bf16(x_lo + offset) : kZero;
    const uint4 hi = live && x_hi_live ? load_x8_bf16(x_hi + offset) : kZero;
    mma_chunk(acc, wt, lo, hi);
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
  for (int idx = threadIdx.x; idx < 16 * Shape::kTileRows; idx += Shape::kThreads) {
    const int n = idx / Shape::kTileRows, r = idx % Shape::kTileRows, row = row0 + r;
    if (n >= m || row >= rows) continue;
    const int value = accumulator_index(n, r);
    float sum = partial[0][value];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += partial[w][value];
    if (bias) sum += bias[row];
    float* out = y + static_cast<int64_t>(n) * rows + row;
    *out = table.accumulate ? *out + sum : sum;
  }
}

// Block stream-K: the unit is a step of one tile: kWarps·kUnroll consecutive chunks, of which
// warp w loads chunks w, w + kWarps, ... (so a block reads one contiguous stretch of each of
// its 8·kRowTiles rows at a time, good for DRAM pages); block b of the grid owns consecutive
// units. At the end of each tile segment the warps' partial sums meet in shared memory (added
// in warp order); a tile shared with other blocks goes through the workspace, and the last
// block to arrive adds the blocks' partial sums in block order.
template <typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    gemv_bf16_stream_k_blocks(const GemvJobTable table, const float* __restrict__ x, int m, int k,
                              GemvWorkspace ws) {
  constexpr int kRowTiles = Shape::kRowTiles, kWarps = Shape::kWarps, kUnroll = Shape::kUnroll;
  constexpr int kBatch = kWarps * kUnroll, kOutputs = 16 * Shape::kTileRows;  // (x row, weight row) pairs
  static_assert(kOutputs <= kGemvMaxSlotFloats, "the workspace holds tiles of at most 16 rows");
  __shared__ float partial[kWarps][kRowTiles * 4 * 32];
  __shared__ int last_to_arrive;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, tig = lane & 3;
  const int chunks = (k + 31) / 32, steps = (chunks + kBatch - 1) / kBatch;
  const int64_t units = int64_t(table.first_tile[table.num_jobs]) * steps;
  const StreamKSplit split{min(int64_t(gridDim.x), units), units, steps};
  const int64_t block = blockIdx.x;
  allow_dependent_launch();
  if (block >= split.parts) return;
  const int64_t u_begin = split.first_unit(block), u_end = split.first_unit(block + 1);
  const bool x_lo_live = group < m, x_hi_live = kWide && group + 8 < m;
  const float* x_lo = x + static_cast<int64_t>(min(group, m - 1)) * k + 8 * tig;
  const float* x_hi = x + static_cast<int64_t>(min(group + 8, m - 1)) * k + 8 * tig;
  constexpr uint4 kZero = {0u, 0u, 0u, 0u};
  bool waited = false;

  for (int64_t u = u_begin; u < u_end;) {
    const int tile = static_cast<int>(u / steps);
    const int s_begin = static_cast<int>(u % steps);
    const int s_end = static_cast<int>(min(static_cast<int64_t>(steps), s_begin + (u_end - u)));
    u += s_end - s_begin;
    const uint16_t* w_lane[kRowTiles];
    const int job = tile_rows<kRowTiles>(table, tile, k, w_lane);
    float acc[kRowTiles][4];
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    for (int s = s_begin; s < s_end; ++s) {
      bool live[kUnroll];
      uint4 w[kUnroll][kRowTiles];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int c = s * kBatch + i * kWarps + warp;
        live[i] = c < chunks && 32 * c + 8 * tig + 8 <= k;
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t)
          w[i][t] = live[i] ? load_weights16(w_lane[t] + 32 * c) : kZero;
      }
      if (!waited) {  // weights first: they depend on no earlier kernel, x does
        wait_for_prerequisite_grids();
        waited = true;
      }
      uint4 lo[kUnroll], hi[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int c = s * kBatch + i * kWarps + warp;
        lo[i] = live[i] && x_lo_live ? load_x8_bf16_coherent(x_lo + 32 * c) : kZero;
        hi[i] = live[i] && x_hi_live ? load_x8_bf16_coherent(x_hi + 32 * c) : kZero;
      }
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) mma_chunk(acc, w[i], lo[i], hi[i]);
    }

#pragma unroll
    for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][(t * 4 + i) * 32 + lane] = acc[t][i];
    __syncthreads();
    const bool whole = s_begin == 0 && s_end == steps;
    const int rows = table.rows[job], row0 = (tile - table.first_tile[job]) * Shape::kTileRows;
    float* y = table.y[job];
    const float* bias = table.bias[job];
    auto store = [&](int idx, float v) {
      const int n = idx / Shape::kTileRows, row = row0 + idx % Shape::kTileRows;
      if (n >= m || row >= rows) return;
      v += bias ? bias[row] : 0.0f;
      float* out = y + static_cast<int64_t>(n) * rows + row;
      *out = table.accumulate ? *out + v : v;
    };
    const int64_t first = whole ? 0 : split.owner(int64_t(tile) * steps);
    const int64_t last = whole ? 0 : split.owner(int64_t(tile + 1) * steps - 1);
    auto slot_of = [&](int64_t b) {  // a block's first tile goes to its slot 0, its last to slot 1
      return ws.partials + (2 * b + (tile == split.first_unit(b) / steps ? 0 : 1)) * kGemvMaxSlotFloats;
    };
    // One thread per (x row n, weight row r) of the tile; consecutive threads, consecutive rows.
    for (int idx = threadIdx.x; idx < kOutputs; idx += Shape::kThreads) {
      const int n = idx / Shape::kTileRows, r = idx % Shape::kTileRows;
      const int value = accumulator_index(n, r);
      float v = partial[0][value];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) v += partial[w][value];
      if (whole)
        store(idx, v);
      else
        slot_of(block)[idx] = v;
    }
    if (!whole) {
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) last_to_arrive = atomicAdd(ws.counters + first, 1) == last - first;
      __syncthreads();
      if (last_to_arrive) {
        __threadfence();
        for (int idx = threadIdx.x; idx < kOutputs; idx += Shape::kThreads) {
          float v = 0.0f;
          for (int64_t b = first; b <= last; ++b) v += __ldcg(slot_of(b) + idx);
          store(idx, v);
        }
        if (threadIdx.x == 0) ws.counters[first] = 0;  // ready for the next launch
      }
    }
    __syncthreads();  // partial[] and last_to_arrive are reused by the next segment
  }
}

}  // namespace ninfer::cuda::kernels
