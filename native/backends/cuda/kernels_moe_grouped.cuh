// Grouped MoE expert GEMMs with the routing plan built on the device (no host round trip).
//
// moe_group_rows (one block) turns the routed expert ids of all (token, slot) pairs into an
// expert-sorted row list (sorted_pair[row] = pair id = token · top_k + slot) and a list of row
// tiles, each tile at most tile_rows rows of one expert. The GEMM kernels launch a grid over the
// worst-case tile count; block y reads its (expert, rows) from tiles[y], blocks past the real
// count exit at once.
//
// moe_grouped_gemm<GateUpSwiglu>: act[row, j] = bf16(silu(x·gate_e[j]) · (x·up_e[j])), x the
// bf16 input row of the pair's token (gathered by token id), e the tile's expert.
// moe_grouped_gemm<Down>: y[pair, c] = act[row, :] · down_e[c] in fp32, one row per pair (the
// combine kernel then adds the weighted rows of each token in slot order: deterministic).
//
// Rows inside an expert are placed by shared-memory atomics, so their order varies between
// runs; no result depends on it (each output row is its own dot products in a fixed k order).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_mma.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kMoeMaxExperts = 512;
inline constexpr int kMoeGroupThreads = 1024;

// Rows [row_begin, row_end) of the expert-sorted list, all routed to `expert`.
struct MoeTile {
  int32_t expert;
  int32_t row_begin;
  int32_t row_end;
  int32_t unused;
};

// One block of kMoeGroupThreads. Invalid ids (outside [0, experts)) are left out of every tile.
__global__ void __launch_bounds__(kMoeGroupThreads)
    moe_group_rows(const int32_t* __restrict__ ids, int pairs, int experts, int tile_rows,
                   int32_t* __restrict__ sorted_pair, MoeTile* __restrict__ tiles, int32_t* __restrict__ tile_count) {
  __shared__ int32_t rows_of[kMoeMaxExperts];  // counts, then the scatter cursors
  __shared__ int32_t row_offset[kMoeMaxExperts];
  __shared__ int32_t tile_offset[kMoeMaxExperts];
  const int tid = threadIdx.x;
  for (int e = tid; e < experts; e += kMoeGroupThreads) rows_of[e] = 0;
  __syncthreads();
  // Four independent loads, then four atomics: the loop is latency-bound otherwise.
  for (int p0 = tid; p0 < pairs; p0 += 4 * kMoeGroupThreads) {
    int e[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) e[u] = p0 + u * kMoeGroupThreads < pairs ? ids[p0 + u * kMoeGroupThreads] : -1;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (e[u] >= 0 && e[u] < experts) atomicAdd(&rows_of[e[u]], 1);
  }
  __syncthreads();
  if (tid < 32) {  // exclusive scans of rows and tiles: lane l owns a run of `per` experts
    const int per = (experts + 31) / 32, begin = tid * per, end = min(begin + per, experts);
    int rows = 0, tiles_here = 0;
    for (int e = begin; e < end; ++e) {
      rows += rows_of[e];
      tiles_here += (rows_of[e] + tile_rows - 1) / tile_rows;
    }
    int rows_before = rows, tiles_before = tiles_here;  // inclusive warp scans, made exclusive below
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int r = __shfl_up_sync(0xffffffffu, rows_before, off), t = __shfl_up_sync(0xffffffffu, tiles_before, off);
      if (tid >= off) {
        rows_before += r;
        tiles_before += t;
      }
    }
    if (tid == 31) *tile_count = tiles_before;
    rows_before -= rows;
    tiles_before -= tiles_here;
    for (int e = begin; e < end; ++e) {
      row_offset[e] = rows_before;
      tile_offset[e] = tiles_before;
      rows_before += rows_of[e];
      tiles_before += (rows_of[e] + tile_rows - 1) / tile_rows;
    }
  }
  __syncthreads();
  for (int e = tid; e < experts; e += kMoeGroupThreads) {
    const int first = row_offset[e], last = first + rows_of[e];
    int t = tile_offset[e];
    for (int r = first; r < last; r += tile_rows) tiles[t++] = MoeTile{e, r, min(r + tile_rows, last), 0};
    rows_of[e] = first;
  }
  __syncthreads();
  for (int p0 = tid; p0 < pairs; p0 += 4 * kMoeGroupThreads) {
    int e[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) e[u] = p0 + u * kMoeGroupThreads < pairs ? ids[p0 + u * kMoeGroupThreads] : -1;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (e[u] >= 0 && e[u] < experts) sorted_pair[atomicAdd(&rows_of[e[u]], 1)] = p0 + u * kMoeGroupThreads;
  }
}

inline constexpr int kMoeKAlign = 8;  // k must be a multiple of this (16-byte copies); tails are zero-filled

// A block tile of BM rows × BN weight rows (for GateUpSwiglu BN/2 gate and BN/2 up rows, i.e.
// BN/2 output columns) and BK of k per pipeline stage, WARPS_M × WARPS_N warps, a STAGES-deep
// cp.async pipeline. Smem rows are padded by 16 bytes so that ldmatrix is free of bank conflicts.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int MIN_BLOCKS>
struct MoeGemmShape {
  static constexpr int kRows = BM, kCols = BN, kTileK = BK, kLd = BK + 8, kStages = STAGES;
  static constexpr int kMinBlocks = MIN_BLOCKS, kWarpsN = WARPS_N;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpRows = BM / WARPS_M, kWarpCols = BN / WARPS_N;
  static constexpr int kMFrags = kWarpRows / 16, kNFrags = kWarpCols / 8;
  static constexpr int kStageElems = (BM + BN) * kLd;
  static constexpr int kSmemBytes = STAGES * kStageElems * 2;
  static constexpr int kPiecesPerRow = BK / 8;                 // 16-byte copies per smem row
  static constexpr int kRowsPerPass = kThreads / kPiecesPerRow;  // rows one pass of the block copies
  static constexpr int kARowsPerThread = BM / kRowsPerPass, kBRowsPerThread = BN / kRowsPerPass;
  static_assert(kWarpRows % 16 == 0 && kNFrags % 4 == 0, "warp tile: 16-row and two-pairs-of-8-column fragments");
  static_assert(BK % 16 == 0 && kThreads % kPiecesPerRow == 0 && BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0,
                "whole 16-byte copies per thread");
};

enum class MoeGemmKind { GateUpSwiglu, Down };

struct MoeGemmArgs {
  const MoeTile* tiles = nullptr;
  const int32_t* tile_count = nullptr;
  const int32_t* sorted_pair = nullptr;
  const uint16_t* a = nullptr;     // GateUpSwiglu: x bf16 [tokens, k] (pair p reads row p / top_k);
                                   // Down: act bf16 [pairs, k] in sorted row order
  int top_k = 1;
  const uint16_t* w = nullptr;     // the expert stack, expert_rows rows of k per expert
  int64_t expert_rows = 0;         // GateUpSwiglu: 2n (gate rows, then up rows); Down: n
  int n = 0;                       // output columns
  int k = 0;                       // a multiple of kMoeKAlign
  uint16_t* act = nullptr;         // GateUpSwiglu output [pairs, n], sorted row order
  float* y = nullptr;              // Down output [pairs, n], row = pair id
};

template <class Shape, MoeGemmKind KIND>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks) moe_grouped_gemm(MoeGemmArgs args) {
  if (static_cast<int>(blockIdx.y) >= *args.tile_count) return;
  constexpr bool kGateUp = KIND == MoeGemmKind::GateUpSwiglu;
  constexpr int BM = Shape::kRows, BN = Shape::kCols, BK = Shape::kTileK, LD = Shape::kLd;
  constexpr int MF = Shape::kMFrags, NF = Shape::kNFrags;
  constexpr int kOutCols = kGateUp ? BN / 2 : BN;
  const MoeTile tile = args.tiles[blockIdx.y];
  const int col0 = static_cast<int>(blockIdx.x) * kOutCols;
  extern __shared__ __align__(16) uint16_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Shape::kWarpsN, wn = warp % Shape::kWarpsN;

  // Each thread copies the same 16-byte piece of the same rows at every k step: rows
  // first_row + j · kRowsPerPass of A and of B.
  const int piece = (tid % Shape::kPiecesPerRow) * 8, first_row = tid / Shape::kPiecesPerRow;
  int a_row[Shape::kARowsPerThread], b_row[Shape::kBRowsPerThread];
#pragma unroll
  for (int j = 0; j < Shape::kARowsPerThread; ++j) {
    int row = tile.row_begin + first_row + j * Shape::kRowsPerPass;
    if (row >= tile.row_end) row = tile.row_begin;  // padding rows: read a valid row, never stored
    a_row[j] = kGateUp ? args.sorted_pair[row] / args.top_k : row;
  }
#pragma unroll
  for (int j = 0; j < Shape::kBRowsPerThread; ++j) {
    const int r = first_row + j * Shape::kRowsPerPass;
    const int half = kGateUp && r >= BN / 2 ? 1 : 0;  // the up rows of the gate | up pair
    const int col = min(col0 + (kGateUp ? r % (BN / 2) : r), args.n - 1);
    b_row[j] = half * args.n + col;  // within the expert
  }
  const uint16_t* w_expert = args.w + tile.expert * args.expert_rows * args.k;
  auto load_stage = [&](int stage, int kt) {
    uint16_t* as = smem + stage * Shape::kStageElems;
    uint16_t* bs = as + BM * LD;
    const int k_at = kt * BK + piece;
    const bool inside = k_at < args.k;  // the k tail is zero-filled
    const int k_src = inside ? k_at : 0;
#pragma unroll
    for (int j = 0; j < Shape::kARowsPerThread; ++j)
      cp_async_16_or_zero(as + (first_row + j * Shape::kRowsPerPass) * LD + piece,
                          args.a + int64_t(a_row[j]) * args.k + k_src, inside);
#pragma unroll
    for (int j = 0; j < Shape::kBRowsPerThread; ++j)
      cp_async_16_or_zero(bs + (first_row + j * Shape::kRowsPerPass) * LD + piece,
                          w_expert + int64_t(b_row[j]) * args.k + k_src, inside);
  };
  // First smem row of the 16 weight rows behind n-fragments 2p and 2p+1 of this warp. GateUp:
  // fragments [0, NF/2) are gate columns and [NF/2, NF) the up columns of the same outputs.
  auto b_row_of_pair = [&](int p) {
    if constexpr (kGateUp)
      return p < NF / 4 ? wn * (NF / 2) * 8 + p * 16 : BN / 2 + wn * (NF / 2) * 8 + (p - NF / 4) * 16;
    else
      return wn * NF * 8 + p * 16;
  };

  float acc[MF][NF][4];
#pragma unroll
  for (int i = 0; i < MF; ++i)
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

  // Fragments of rows past the tile's end are neither loaded nor multiplied (an expert's last
  // tile is often mostly padding); the other block on the SM gets the tensor cores meanwhile.
  const int warp_rows = tile.row_end - tile.row_begin - wm * Shape::kWarpRows;
  const int k_tiles = (args.k + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < Shape::kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Shape::kStages - 2>();
    __syncthreads();  // stage kt landed for all threads; stage kt-1 is no longer read
    const int next = kt + Shape::kStages - 1;
    if (next < k_tiles) load_stage(next % Shape::kStages, next);
    cp_async_commit();
    const uint16_t* as = smem + (kt % Shape::kStages) * Shape::kStageElems;
    const uint16_t* bs = as + BM * LD;
    if (warp_rows <= 0) continue;
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      uint32_t af[MF][4], bf[NF][2];
#pragma unroll
      for (int i = 0; i < MF; ++i)
        if (i * 16 < warp_rows)
          ldmatrix_x4(af[i], as + (wm * Shape::kWarpRows + i * 16 + (lane & 15)) * LD + ks + (lane >> 4) * 8);
#pragma unroll
      for (int p = 0; p < NF / 2; ++p) {
        uint32_t r[4];
        ldmatrix_x4(r, bs + (b_row_of_pair(p) + (lane & 7) + ((lane >> 4) << 3)) * LD + ks + ((lane >> 3) & 1) * 8);
        bf[2 * p][0] = r[0];
        bf[2 * p][1] = r[1];
        bf[2 * p + 1][0] = r[2];
        bf[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MF; ++i)
        if (i * 16 < warp_rows)
#pragma unroll
          for (int j = 0; j < NF; ++j) mma_bf16_16816(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  cp_async_wait<0>();

  // Accumulator fragment: rows lane/4 (+8 for elements 2, 3), columns 2(lane%4), +1.
  const int row_in_tile = wm * Shape::kWarpRows + (lane >> 2);
#pragma unroll
  for (int i = 0; i < MF; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = tile.row_begin + row_in_tile + i * 16 + h * 8;
      if (row >= tile.row_end) continue;
      if constexpr (kGateUp) {
        uint16_t* out = args.act + int64_t(row) * args.n;
#pragma unroll
        for (int j = 0; j < NF / 2; ++j) {
          const int col = col0 + wn * (NF / 2) * 8 + j * 8 + 2 * (lane & 3);
          if (col >= args.n) continue;
          const float g0 = acc[i][j][2 * h], g1 = acc[i][j][2 * h + 1];
          const float u0 = acc[i][j + NF / 2][2 * h], u1 = acc[i][j + NF / 2][2 * h + 1];
          *reinterpret_cast<uint32_t*>(out + col) =
              pack_bf16x2(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
        }
      } else {
        float* out = args.y + int64_t(args.sorted_pair[row]) * args.n;
#pragma unroll
        for (int j = 0; j < NF; ++j) {
          const int col = col0 + wn * NF * 8 + j * 8 + 2 * (lane & 3);
          if (col >= args.n) continue;
          *reinterpret_cast<float2*>(out + col) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
}

}  // namespace ninfer::cuda::kernels
