// bf16-weight GEMV for decode-sized batches on tensor cores: y[m, n] = x[m, k] · W[n, k]^T
// (+ bias, + the old y when accumulating) with m <= 16.
//
// The product is memory-bound: each weight byte is read once, and what matters is that every
// SM keeps enough 16-byte loads in flight from the first microsecond to the last. One mma.sync
// m16n8k16 takes x (up to 16 rows, the A operand) against 8 weight rows (the B operand) over
// 16 k. A dot product does not care in which order k is summed, so k is permuted identically
// in both operands and each lane's B fragment of two consecutive mmas is one 16-byte load of
// 8 consecutive weights (its A fragment 8 consecutive x values):
//   mma 0: logical k {2t, 2t+1, 2t+8, 2t+9} <- physical k 8t + {0, 1, 2, 3}
//   mma 1: the same logical k                <- physical k 8t + {4, 5, 6, 7}
// for the lane's thread-in-group t (lane % 4); the lane's group g (lane / 4) picks its weight
// row and its x rows (g and g + 8). A warp thus covers 8 weight rows × 32 k per pair of mmas.
//
// Work is split stream-K style: the weights are cut into units of (a tile of 8·kRowTiles rows)
// × (32 k), numbered tile by tile, and the grid (as many warps as the chip holds at once)
// gives every warp the same number of consecutive units (±1). All warps start together and
// finish together: no partial last wave of blocks, which costs a block-per-row-group GEMV
// 10-20 µs per launch on the H200. A warp whose units cover a whole tile writes its outputs;
// the warps sharing a tile at their range ends leave partial sums in the workspace, and the
// last of them to arrive (a counter per tile) adds them in warp order, so results are
// deterministic. x is read as f32 through L1 (small, shared by every warp) and rounded to
// bf16 like the cuBLAS path's input, so results do not depend on which path (and so which
// batch size) computed them; products accumulate in f32.
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
  int32_t first_block[5];  // block-split baseline: prefix sums of blocks per job
  int32_t first_tile[5];   // prefix sums of row tiles per job
  int32_t num_jobs;
  int32_t accumulate;      // y += x · W^T (+ bias) instead of y = ...
};

// Per warp of the grid: two partial tiles (the first and the last of its range) and one
// counter (of the tile whose first unit it owns). Counters are zero between launches: the
// warp that completes a shared tile resets its counter.
struct GemvWorkspace {
  float* partials = nullptr;
  int32_t* counters = nullptr;
  int64_t max_warps = 0;
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

// The compile-time shape of one GEMV kernel: tiles of 8·kRowTiles weight rows, kWarps warps
// a block, and kDepth 32-wide chunks of weights in flight per warp: loaded into registers in
// batches of kDepth, or (kPipelined) streamed into a per-lane shared-memory ring of kDepth
// stages by cp.async, which needs no registers for the loads in flight.
template <int kRowTiles_, int kWarps_, int kDepth_, bool kPipelined_ = false,
          WeightLoad kLoad_ = WeightLoad::StreamPrefetch, int kMinBlocks_ = 1>
struct GemvShape {
  static constexpr int kRowTiles = kRowTiles_, kWarps = kWarps_, kDepth = kDepth_, kUnroll = kDepth_;
  static constexpr int kMinBlocks = kMinBlocks_;  // per SM, for __launch_bounds__ (caps registers)
  static constexpr bool kPipelined = kPipelined_;
  static constexpr WeightLoad kLoad = kLoad_;
  static constexpr int kBlockRows = 8 * kRowTiles;  // rows of a tile
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSlotFloats = kRowTiles * 4 * 32;  // one warp's accumulators of a tile
  static constexpr int kRingBytes = kPipelined ? kWarps * kDepth * kRowTiles * 32 * 16 : 0;  // dynamic smem
};
inline constexpr int kGemvMaxSlotFloats = 2 * 4 * 32;  // tiles of at most 16 rows

// The stream-K split: units of work numbered tile by tile, `parts` workers (warps or blocks;
// never more than units, so none is idle), worker w owns units [first_unit(w),
// first_unit(w + 1)).
struct StreamKSplit {
  int64_t parts, units;
  int chunks;  // units per tile
  __device__ int64_t first_unit(int64_t w) const { return w * units / parts; }
  __device__ int64_t owner(int64_t u) const { return ((u + 1) * parts - 1) / units; }
};

// Writes one warp's accumulators of a tile: acc[t] = {y[g][r], y[g][r + 1], y[g + 8][r],
// y[g + 8][r + 1]} with r = row0 + 8t + 2·tig. A tile the warp only partly covered (`whole`
// false) first goes through the workspace: the warps that share it each leave their partial
// sums, and the last to arrive adds all of them in warp order and writes the outputs.
template <int kRowTiles>
__device__ void store_tile(const GemvJobTable& table, const GemvWorkspace& ws, const StreamKSplit& split,
                           int64_t warp, int job, int tile, int m, bool whole, float (&acc)[kRowTiles][4]) {
  const int lane = threadIdx.x & 31, group = lane >> 2, tig = lane & 3;
  if (!whole) {
    const int64_t first = split.owner(int64_t(tile) * split.chunks);
    const int64_t last = split.owner(int64_t(tile + 1) * split.chunks - 1);
    auto slot_of = [&](int64_t w) {  // a warp's first tile goes to its slot 0, its last to slot 1
      return ws.partials + (2 * w + (tile == split.first_unit(w) / split.chunks ? 0 : 1)) * kGemvMaxSlotFloats;
    };
    float* mine = slot_of(warp);
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) mine[(t * 4 + i) * 32 + lane] = acc[t][i];
    __threadfence();
    __syncwarp();
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(ws.counters + first, 1);
    if (__shfl_sync(0xffffffffu, arrived, 0) != last - first) return;
    __threadfence();
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
    for (int64_t w = first; w <= last; ++w) {
      const float* theirs = slot_of(w);
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] += __ldcg(theirs + (t * 4 + i) * 32 + lane);
    }
    if (lane == 0) ws.counters[first] = 0;  // ready for the next launch
  }
  const int rows = table.rows[job];
  const int row0 = (tile - table.first_tile[job]) * 8 * kRowTiles;
  float* y = table.y[job];
  const float* bias = table.bias[job];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = group + (i >= 2 ? 8 : 0), row = row0 + 8 * t + 2 * tig + (i & 1);
      if (n >= m || row >= rows) continue;
      const float v = acc[t][i] + (bias ? bias[row] : 0.0f);
      float* out = y + static_cast<int64_t>(n) * rows + row;
      *out = table.accumulate ? *out + v : v;
    }
}

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

template <bool kWide, int kRowTiles>
__device__ __forceinline__ void mma_chunk(float (&acc)[kRowTiles][4], const uint4 (&w)[kRowTiles], const uint4& lo,
                                          const uint4& hi) {
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) {
    mma_m16n8k16_bf16(acc[t], lo.x, hi.x, lo.y, hi.y, w[t].x, w[t].y);
    mma_m16n8k16_bf16(acc[t], lo.z, hi.z, lo.w, hi.w, w[t].z, w[t].w);
  }
}

// Register batches: each warp walks its units tile segment by tile segment, kDepth chunks at a
// time. kWide: m > 8, so x rows 8..15 (the upper half of the A fragment) are live.
template <typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads)
    gemv_bf16_stream_k(const GemvJobTable table, const float* __restrict__ x, int m, int k, GemvWorkspace ws) {
  constexpr int kRowTiles = Shape::kRowTiles, kUnroll = Shape::kUnroll;
  static_assert(Shape::kSlotFloats <= kGemvMaxSlotFloats, "the workspace holds tiles of at most 16 rows");
  const int lane = threadIdx.x & 31, group = lane >> 2, tig = lane & 3;
  const int chunks = (k + 31) / 32;
  const int64_t units = int64_t(table.first_tile[table.num_jobs]) * chunks;
  const StreamKSplit split{min(int64_t(gridDim.x) * Shape::kWarps, units), units, chunks};
  const int64_t warp = int64_t(blockIdx.x) * Shape::kWarps + (threadIdx.x >> 5);
  allow_dependent_launch();
  if (warp >= split.parts) return;
  const int64_t u_begin = split.first_unit(warp), u_end = split.first_unit(warp + 1);

  const bool x_lo_live = group < m, x_hi_live = kWide && group + 8 < m;
  const float* x_lo = x + static_cast<int64_t>(min(group, m - 1)) * k + 8 * tig;
  const float* x_hi = x + static_cast<int64_t>(min(group + 8, m - 1)) * k + 8 * tig;
  constexpr uint4 kZero = {0u, 0u, 0u, 0u};
  bool waited = false;

  for (int64_t u = u_begin; u < u_end;) {
    const int tile = static_cast<int>(u / chunks);
    const int c_begin = static_cast<int>(u % chunks);
    const int c_end = static_cast<int>(min(static_cast<int64_t>(chunks), c_begin + (u_end - u)));
    u += c_end - c_begin;
    const uint16_t* w_lane[kRowTiles];
    const int job = tile_rows<kRowTiles>(table, tile, k, w_lane);
    float acc[kRowTiles][4];
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    for (int c = c_begin; c < c_end; c += kUnroll) {
      // A lane whose 8 k lie past the segment or past k contributes zeros.
      bool live[kUnroll];
      uint4 w[kUnroll][kRowTiles];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        live[i] = c + i < c_end && 32 * (c + i) + 8 * tig + 8 <= k;
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t)
          w[i][t] = live[i] ? load_weights16<Shape::kLoad>(w_lane[t] + 32 * (c + i)) : kZero;
      }
      // The weights depend on no earlier kernel: the first batch streams in while the previous
      // kernel (when this one was launched with programmatic serialization) may still run.
      if (!waited) {
        wait_for_prerequisite_grids();
        waited = true;
      }
      uint4 lo[kUnroll], hi[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        lo[i] = live[i] && x_lo_live ? load_x8_bf16(x_lo + 32 * (c + i)) : kZero;
        hi[i] = live[i] && x_hi_live ? load_x8_bf16(x_hi + 32 * (c + i)) : kZero;
      }
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) mma_chunk<kWide>(acc, w[i], lo[i], hi[i]);
    }
    store_tile<kRowTiles>(table, ws, split, warp, job, tile, m, c_begin == 0 && c_end == chunks, acc);
  }
}

// 16 bytes global -> shared, bypassing L1 and prefetching the surrounding 256 bytes into L2;
// zeros instead when !live.
__device__ __forceinline__ void cp_async16(void* smem, const void* global, bool live) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(global),
               "r"(live ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// cp.async ring: each lane streams its own 16-byte pieces of the next kDepth units (across
// tile boundaries) into its slots of a shared-memory ring and reads back only what it copied,
// so no barrier is needed; x is loaded one unit ahead.
template <typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads)
    gemv_bf16_stream_k_pipelined(const GemvJobTable table, const float* __restrict__ x, int m, int k,
                                 GemvWorkspace ws) {
  constexpr int kRowTiles = Shape::kRowTiles, kStages = Shape::kDepth;
  static_assert(Shape::kPipelined && Shape::kSlotFloats <= kGemvMaxSlotFloats, "a pipelined shape of <= 16 rows");
  extern __shared__ uint4 ring[];
  const int lane = threadIdx.x & 31, group = lane >> 2, tig = lane & 3;
  uint4* my_ring = ring + (threadIdx.x >> 5) * kStages * kRowTiles * 32 + lane;  // [stage][tile][lane]
  const int chunks = (k + 31) / 32;
  const int64_t units = int64_t(table.first_tile[table.num_jobs]) * chunks;
  const StreamKSplit split{min(int64_t(gridDim.x) * Shape::kWarps, units), units, chunks};
  const int64_t warp = int64_t(blockIdx.x) * Shape::kWarps + (threadIdx.x >> 5);
  allow_dependent_launch();
  if (warp >= split.parts) return;
  const int64_t u_begin = split.first_unit(warp), u_end = split.first_unit(warp + 1);

  // The issuing cursor runs kStages units ahead of the consuming one.
  int64_t issued = u_begin;
  int issue_tile = static_cast<int>(u_begin / chunks), issue_c = static_cast<int>(u_begin % chunks);
  const uint16_t* issue_rows[kRowTiles];
  tile_rows<kRowTiles>(table, issue_tile, k, issue_rows);
  auto issue = [&](int stage) {
    if (issued < u_end) {
      const bool live = 32 * issue_c + 8 * tig + 8 <= k;
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t)
        cp_async16(my_ring + (stage * kRowTiles + t) * 32, issue_rows[t] + 32 * issue_c, live);
      ++issued;
      if (++issue_c == chunks && issued < u_end) {
        issue_c = 0;
        tile_rows<kRowTiles>(table, ++issue_tile, k, issue_rows);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the group count uniform
  };
#pragma unroll
  for (int s = 0; s < kStages; ++s) issue(s);
  wait_for_prerequisite_grids();  // the weights above depend on no earlier kernel; x does

  const bool x_lo_live = group < m, x_hi_live = kWide && group + 8 < m;
  const float* x_lo = x + static_cast<int64_t>(min(group, m - 1)) * k + 8 * tig;
  const float* x_hi = x + static_cast<int64_t>(min(group + 8, m - 1)) * k + 8 * tig;
  constexpr uint4 kZero = {0u, 0u, 0u, 0u};
  auto load_x = [&](int c, uint4& lo, uint4& hi) {
    const bool live = 32 * c + 8 * tig + 8 <= k;
    lo = live && x_lo_live ? load_x8_bf16(x_lo + 32 * c) : kZero;
    hi = live && x_hi_live ? load_x8_bf16(x_hi + 32 * c) : kZero;
  };

  int tile = static_cast<int>(u_begin / chunks), c = static_cast<int>(u_begin % chunks), segment_begin = c;
  int job = 0;
  while (tile >= table.first_tile[job + 1]) ++job;
  float acc[kRowTiles][4];
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  uint4 lo, hi;
  load_x(c, lo, hi);
  int stage = 0;
  for (int64_t u = u_begin; u < u_end; ++u) {
    cp_async_wait<kStages - 1>();  // this unit's group has landed
    uint4 w[kRowTiles];
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) w[t] = my_ring[(stage * kRowTiles + t) * 32];
    const uint4 cur_lo = lo, cur_hi = hi;
    const int next_c = c + 1 == chunks ? 0 : c + 1;
    if (u + 1 < u_end) load_x(next_c, lo, hi);
    mma_chunk<kWide>(acc, w, cur_lo, cur_hi);
    issue(stage);  // after the reads of this stage (in order: the mma needed them)
    stage = stage + 1 == kStages ? 0 : stage + 1;
    if (next_c == 0 || u + 1 == u_end) {
      store_tile<kRowTiles>(table, ws, split, warp, job, tile, m, segment_begin == 0 && c + 1 == chunks, acc);
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
      segment_begin = 0;
      if (next_c == 0 && u + 1 < u_end) {
        ++tile;
        while (tile >= table.first_tile[job + 1]) ++job;
      }
    }
    c = next_c;
  }
  cp_async_wait<0>();
}

// Block stream-K: the unit is a step of one tile: kWarps·kUnroll consecutive chunks, of which
// warp w loads chunks w, w + kWarps, ... (so a block reads one contiguous stretch of each of
// its 8·kRowTiles rows at a time, good for DRAM pages); block b of the grid owns consecutive
// units. At the end of each tile segment the warps' partial sums meet in shared memory (added
// in warp order); a tile shared with other blocks goes through the workspace as in store_tile,
// block by block.
template <typename Shape, bool kWide>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    gemv_bf16_stream_k_blocks(const GemvJobTable table, const float* __restrict__ x, int m, int k,
                              GemvWorkspace ws) {
  constexpr int kRowTiles = Shape::kRowTiles, kWarps = Shape::kWarps, kUnroll = Shape::kUnroll;
  constexpr int kBatch = kWarps * kUnroll, kOutputs = 16 * Shape::kBlockRows;  // (x row, weight row) pairs
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
          w[i][t] = live[i] ? load_weights16<Shape::kLoad>(w_lane[t] + 32 * c) : kZero;
      }
      if (!waited) {  // weights first: they depend on no earlier kernel, x does
        wait_for_prerequisite_grids();
        waited = true;
      }
      uint4 lo[kUnroll], hi[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int c = s * kBatch + i * kWarps + warp;
        lo[i] = live[i] && x_lo_live ? load_x8_bf16(x_lo + 32 * c) : kZero;
        hi[i] = live[i] && x_hi_live ? load_x8_bf16(x_hi + 32 * c) : kZero;
      }
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) mma_chunk<kWide>(acc, w[i], lo[i], hi[i]);
    }

#pragma unroll
    for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][(t * 4 + i) * 32 + lane] = acc[t][i];
    __syncthreads();
    const bool whole = s_begin == 0 && s_end == steps;
    const int rows = table.rows[job], row0 = (tile - table.first_tile[job]) * Shape::kBlockRows;
    float* y = table.y[job];
    const float* bias = table.bias[job];
    auto store = [&](int idx, float v) {
      const int n = idx / Shape::kBlockRows, row = row0 + idx % Shape::kBlockRows;
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
      const int n = idx / Shape::kBlockRows, r = idx % Shape::kBlockRows;
      const int value = ((r / 8) * 4 + (n >= 8 ? 2 : 0) + (r & 1)) * 32 + (n & 7) * 4 + (r & 7) / 2;
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
