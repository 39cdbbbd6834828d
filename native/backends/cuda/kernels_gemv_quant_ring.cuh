// Decode GEMVs over FP8/NVFP4 weights whose weight bytes stream through a shared-memory ring
// filled by the bulk-copy engine (cp.async.bulk, completion on mbarriers).
//
// Why (bench/RESULTS.md, 2026-12-01): the register-loading kernels (kernels_gemv_quant.cuh,
// kernels_gemv_quant_staged.cuh) read FP8 at 39-64 % and NVFP4 at 21-35 % of the copy rate.
// A quantized weight row holds 2-4 times fewer bytes per k than a bf16 one, so the same
// per-lane loads put 2-4 times fewer bytes in flight, and a warp has none in flight while it
// dequantizes. HBM needs ~4.2 TB/s × ~0.7 µs ≈ 3 MB in flight, ~24 KB per SM. Here each block
// keeps `slots` stages (8-20 KB each) in flight, issued by one instruction per weight row and
// stage, whatever the consumers do.
//
// Measured (H200, bench/RESULTS.md 2026-12-02): that premise did not hold. With 4 blocks an SM
// and 4 slots (10+ MB in flight over the chip) this kernel reads FP8 at m = 1 at ~57 % of the
// copy rate, below the register-loading kernels (~60-64 %), so bytes in flight are not what
// limits either; one bulk copy per 512-1024-byte row and stage is the suspect (a 2D tensor
// map would move a whole stage in one copy). Where it wins is m = 8-16: x staged once per
// block, or reused over 32-row tiles (launchers_gemv_quant.cu takes it there).
//
// The arithmetic is the staged kernel's: fp16 mma, e4m3x2 → f16x2 in one cvt (exact), e2m1 ×
// its e4m3 group scale exact in f16 (here by bit placement instead of a table, below), x
// rounded to bf16 then f16 of x · 2^-8 (the 2^8 goes back in f32). x is staged once per block
// in shared memory where it fits (kStagedX), else each warp converts its fragments from f32
// as it goes; kWide: m > 8 (x rows 8-15 live). Tiles (8·kRowTiles rows), the k layout inside
// a 128-k unit, the warp split of units and the deterministic warp-order reduction are the
// general kernel's.
//
// Stage s of a tile holds bytes [s·kStageRowBytes, (s+1)·kStageRowBytes) of each of its rows
// (rows padded so that the lanes of a quarter warp hit distinct banks) and, for NVFP4, the
// matching e4m3 group scales. A producer warp issues the copies (one per row and stage) as
// soon as a slot is free; each of the 4 consumer warps waits for the slot's full barrier,
// consumes its units and arrives on the slot's empty barrier, with no block-wide barrier in
// the stream (the consumers meet only at a tile's end, for its deterministic reduction). The
// weights depend on no earlier kernel: the producer never waits for the prerequisite grids.
#pragma once

#include "backends/cuda/kernels_gemv_quant_staged.cuh"

namespace ninfer::cuda::kernels {

template <bool kNvfp4, int kRowTiles>
struct RingShape {
  // kWarps consumer warps and one producer warp (the last).
  static constexpr int kWarps = 4, kThreads = 32 * (kWarps + 1), kMaxSlots = 16;
  static constexpr int kTileRows = 8 * kRowTiles;
  static constexpr int kStageRowBytes = kTileRows == 8 ? 1024 : 512;  // codes of one row per stage
  static constexpr int kUnitBytes = kNvfp4 ? 64 : 128;                // 128 k
  static constexpr int kUnitsPerStage = kStageRowBytes / kUnitBytes;
  static constexpr int kUnitsPerWarp = kUnitsPerStage / kWarps;
  // fp8: a lane reads bytes [32t, 32t + 16) of a row's unit, nvfp4 [16t, 16t + 16): the next
  // row (the lanes 4-7 of the quarter warp) starts 16 / 64 bytes later in the banks.
  static constexpr int kRowPitch = kStageRowBytes + (kNvfp4 ? 64 : 16);
  static constexpr int kScalePitch = kNvfp4 ? kStageRowBytes / 8 : 0;  // e4m3 per 16 k
  static constexpr int kStageBytes = kTileRows * (kRowPitch + kScalePitch);
  static constexpr int kValues = kRowTiles * 4 * 32;                // a warp's partial sums of a tile
  static constexpr int kHeadBytes = 256 + kWarps * kValues * 4;      // mbarriers, partial sums
  static_assert(kUnitsPerWarp >= 1 && kUnitsPerStage % kWarps == 0);
};

// Shared memory of a launch: mbarriers, partial sums, `slots` stages, then x as f16 where it is
// staged (staged_x_bytes).
template <bool kNvfp4, int kRowTiles>
inline size_t ring_smem_bytes(int slots, size_t x_bytes) {
  using S = RingShape<kNvfp4, kRowTiles>;
  return S::kHeadBytes + static_cast<size_t>(slots) * S::kStageBytes + x_bytes;
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

// The consumer warps' own barrier (named barrier 1; the producer warp takes no part).
template <int kConsumerThreads>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global to this block's shared
// memory, counted against the mbarrier's expected transaction bytes.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}

// d += A (16×16 f16, rows 8-15 live) · B (16×8 f16), f32 accumulators.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 8 e2m1 codes (code j in nibble j) as 4 f16x2 of value · 2^-14, the pairs (0, 4), (1, 5),
// (2, 6), (3, 7): the sign goes to bit 15 and the 3 magnitude bits to bits 11..9 of an f16,
// which is value · 2^-14 for the normal and the subnormal codes alike. Codes n and n + 4 sit 16
// bits apart in the word, as the two halves of an f16x2 do, so one shift serves both halves:
// 15 instructions for 8 codes, no table.
__device__ __forceinline__ uint4 e2m1x8_to_f16_scaled(uint32_t w) {
  constexpr uint32_t kMag = 0x0E000E00u, kSign = 0x80008000u;
  return {((w << 9) & kMag) | ((w << 12) & kSign), ((w << 5) & kMag) | ((w << 8) & kSign),
          ((w << 1) & kMag) | ((w << 4) & kSign), ((w >> 3) & kMag) | (w & kSign)};
}

// The order of a lane's 8 x values within an 8-k chunk that matches its weights: natural for
// fp8, the pairs (0, 4), (1, 5), (2, 6), (3, 7) for nvfp4 (e2m1x8_to_f16_scaled).
template <bool kNvfp4>
__device__ __forceinline__ uint4 x8_to_staged_f16(const float4& a, const float4& b) {
  if constexpr (kNvfp4)
    return {staged_x_f16x2(a.x, b.x), staged_x_f16x2(a.y, b.y), staged_x_f16x2(a.z, b.z), staged_x_f16x2(a.w, b.w)};
  else
    return {staged_x_f16x2(a.x, a.y), staged_x_f16x2(a.z, a.w), staged_x_f16x2(b.x, b.y), staged_x_f16x2(b.z, b.w)};
}

// 8 consecutive f32 x values as the staged f16 (bf16-rounded, × 2^-8), in the order above.
template <bool kNvfp4>
__device__ __forceinline__ uint4 load_x8_staged_f16(const float* p) {
  return x8_to_staged_f16<kNvfp4>(__ldg(reinterpret_cast<const float4*>(p)),
                                  __ldg(reinterpret_cast<const float4*>(p + 4)));
}

// NVFP4: the e4m3 group scale as f16x2 times 2^7, so that (value · 2^-14) · (scale · 2^7) =
// value · scale · 2^-7 is exact in f16 (at most 6 significant bits between 2^-17 and 21: the
// smallest lands on f16's subnormal grid no finer than 2^-22, above its 2^-24 step). The
// kernel's end multiplies the 2^7 back in, with the row scale.
inline constexpr float kRingNvfp4Unscale = 128.0f;

__device__ __forceinline__ uint32_t e4m3_to_f16x2_splat_x128(uint8_t code) {
  return f16x2_mul(e4m3_to_f16x2_splat(code), 0x58005800u);  // f16 128 = 0x5800
}

// Persistent: block b takes tiles b, b + gridDim.x, ... and streams them through one ring of
// `slots` stages (items: (tile, stage) in that order), so x is staged once per block and the
// copies of the next tile are in flight while the last stages of this one are consumed.
template <bool kNvfp4, int kRowTiles, bool kStagedX, bool kWide>
__global__ void __launch_bounds__(RingShape<kNvfp4, kRowTiles>::kThreads)
    gemv_quant_ring(const QuantGemvTable table, const float* __restrict__ x, int m, int k, int slots) {
  using S = RingShape<kNvfp4, kRowTiles>;
  constexpr int kTileRows = S::kTileRows, kWarps = S::kWarps, kValues = S::kValues;
  extern __shared__ __align__(128) uint8_t ring_smem[];
  auto* full = reinterpret_cast<uint64_t*>(ring_smem);        // slot filled (producer's expect_tx)
  auto* empty = reinterpret_cast<uint64_t*>(ring_smem + 128);  // slot consumed (one arrival a warp)
  auto* partial = reinterpret_cast<float*>(ring_smem + 256);
  uint8_t* ring = ring_smem + S::kHeadBytes;
  auto* xs = reinterpret_cast<uint16_t*>(ring + slots * S::kStageBytes);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, tig = lane & 3;
  const int units = (k + 127) / 128, col_blocks = units;
  const int row_bytes = kNvfp4 ? k / 2 : k;
  const int num_stages = (row_bytes + S::kStageRowBytes - 1) / S::kStageRowBytes;
  const int tiles = table.first_tile[table.num_jobs];
  const int my_tiles = (tiles - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x;
  const int items = my_tiles * num_stages;

  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) mbarrier_init(&full[s], 1), mbarrier_init(&empty[s], kWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // The job and first row of this block's i-th tile.
  auto tile_at = [&](int i, int& job_index) {
    const int tile = static_cast<int>(blockIdx.x) + i * static_cast<int>(gridDim.x);
    int jj = 0;
    while (tile >= table.first_tile[jj + 1]) ++jj;
    job_index = jj;
    return (tile - table.first_tile[jj]) * kTileRows;
  };

  // The producer warp: item `item` (a stage of every row of a tile) into its slot (rows past
  // the end re-read the last row: valid memory, never stored).
  auto issue = [&](int item) {
    const int slot = item % slots, stage = item % num_stages, offset = stage * S::kStageRowBytes;
    int jj;
    const int first = tile_at(item / num_stages, jj);
    const QuantGemvJob& job = table.job[jj];
    const int bytes = min(S::kStageRowBytes, row_bytes - offset);
    const int scale_bytes = kNvfp4 ? bytes / 8 : 0;
    if (lane == 0) mbarrier_arrive_expect_tx(&full[slot], kTileRows * (bytes + scale_bytes));
    __syncwarp();
    if (lane < kTileRows) {
      const int row = min(first + lane, job.rows - 1);
      uint8_t* base = ring + slot * S::kStageBytes;
      bulk_copy_to_shared(base + lane * S::kRowPitch, job.codes + static_cast<int64_t>(row) * row_bytes + offset,
                          bytes, &full[slot]);
      if constexpr (kNvfp4)
        bulk_copy_to_shared(base + kTileRows * S::kRowPitch + lane * S::kScalePitch,
                            static_cast<const uint8_t*>(job.scales) +
                                static_cast<int64_t>(job.first_row + row) * (k / 16) + offset / 8,
                            scale_bytes, &full[slot]);
    }
  };

  allow_dependent_launch();
  if (warp == kWarps) {
    // Weights depend on no earlier kernel: no wait for the prerequisite grids here. A slot is
    // refilled once every consumer warp has arrived on its empty barrier.
    for (int i = 0; i < items; ++i) {
      if (i >= slots) mbarrier_wait_parity(&empty[i % slots], static_cast<uint32_t>(i / slots - 1) & 1u);
      issue(i);
    }
    return;
  }
  wait_for_prerequisite_grids();

  if constexpr (kStagedX) {
    const int per_row = k / 8, xs_stride = k + 8;
    for (int i = threadIdx.x; i < m * per_row; i += 32 * kWarps) {
      const int r = i / per_row, c = (i - r * per_row) * 8;
      *reinterpret_cast<uint4*>(xs + r * xs_stride + c) =
          load_x8_staged_f16<kNvfp4>(x + static_cast<int64_t>(r) * k + c);
    }
    consumers_sync<32 * kWarps>();
  }
  const bool x_lo_live = group < m, x_hi_live = kWide && group + 8 < m;
  const uint16_t* xs_lo = xs + min(group, m - 1) * (k + 8) + 32 * tig;
  const uint16_t* xs_hi = xs + min(group + 8, m - 1) * (k + 8) + 32 * tig;
  const float* x_lo = x + static_cast<int64_t>(min(group, m - 1)) * k + 32 * tig;
  const float* x_hi = x + static_cast<int64_t>(min(group + 8, m - 1)) * k + 32 * tig;
  constexpr uint4 kZero = {0u, 0u, 0u, 0u};

  int job_index = 0, row0 = 0;
  int acc_row[kRowTiles][2];
  float acc[kRowTiles][4];
  for (int item = 0; item < items; ++item) {
    const int stage = item % num_stages, slot = item % slots;
    if (stage == 0) {
      row0 = tile_at(item / num_stages, job_index);
      const int rows = table.job[job_index].rows;
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) acc_row[t][i] = min(row0 + 8 * t + 2 * tig + i, rows - 1);
      }
    }
    const QuantGemvJob& job = table.job[job_index];
    mbarrier_wait_parity(&full[slot], static_cast<uint32_t>(item / slots) & 1u);
    const uint8_t* codes = ring + slot * S::kStageBytes;
    const uint8_t* group_scales = codes + kTileRows * S::kRowPitch;
#pragma unroll
    for (int uw = 0; uw < S::kUnitsPerWarp; ++uw) {
      const int in_stage = warp + uw * kWarps, unit = stage * S::kUnitsPerStage + in_stage;
      if (unit >= units) continue;  // (not break: that made one instantiation spill)
      const int kbase = unit * 128 + 32 * tig;
      bool live[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) live[s] = kbase + 8 * s + 8 <= k;
      uint4 lo[4], hi[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if constexpr (kStagedX) {
          lo[s] = live[s] && x_lo_live ? *reinterpret_cast<const uint4*>(xs_lo + unit * 128 + 8 * s) : kZero;
          hi[s] = kWide && live[s] && x_hi_live ? *reinterpret_cast<const uint4*>(xs_hi + unit * 128 + 8 * s)
                                                : kZero;
        } else {
          lo[s] = live[s] && x_lo_live ? load_x8_staged_f16<kNvfp4>(x_lo + unit * 128 + 8 * s) : kZero;
          hi[s] = kWide && live[s] && x_hi_live ? load_x8_staged_f16<kNvfp4>(x_hi + unit * 128 + 8 * s) : kZero;
        }
      }
      uint4 raw[kRowTiles][2];
      uint32_t group_scale[kRowTiles][2];
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        const uint8_t* row = codes + (8 * t + group) * S::kRowPitch + in_stage * S::kUnitBytes;
        if constexpr (kNvfp4) {
          raw[t][0] = *reinterpret_cast<const uint4*>(row + 16 * tig);
          const uint16_t both = *reinterpret_cast<const uint16_t*>(group_scales + (8 * t + group) * S::kScalePitch +
                                                                    in_stage * 8 + 2 * tig);
          group_scale[t][0] = e4m3_to_f16x2_splat_x128(static_cast<uint8_t>(both));
          group_scale[t][1] = e4m3_to_f16x2_splat_x128(static_cast<uint8_t>(both >> 8));
        } else {
          raw[t][0] = *reinterpret_cast<const uint4*>(row + 32 * tig);
          raw[t][1] = *reinterpret_cast<const uint4*>(row + 32 * tig + 16);
        }
      }
      float part[kRowTiles][4];
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) part[t][0] = part[t][1] = part[t][2] = part[t][3] = 0.0f;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          uint4 w;
          if constexpr (kNvfp4) {
            const uint4& r = raw[t][0];
            const uint32_t word = s == 0 ? r.x : s == 1 ? r.y : s == 2 ? r.z : r.w;
            const uint4 v = e2m1x8_to_f16_scaled(word);
            const uint32_t g = group_scale[t][s / 2];
            w = {f16x2_mul(v.x, g), f16x2_mul(v.y, g), f16x2_mul(v.z, g), f16x2_mul(v.w, g)};
          } else {
            const uint4& r = raw[t][s / 2];
            w = (s & 1) ? e4m3x8_to_f16(r.z, r.w) : e4m3x8_to_f16(r.x, r.y);
          }
          if (!live[s]) w = kZero;  // past k the slot holds stale bytes (NaN codes among them)
          float (&d)[4] = kNvfp4 ? acc[t] : part[t];
          if constexpr (kWide) {
            mma_m16n8k16_f16(d, lo[s].x, hi[s].x, lo[s].y, hi[s].y, w.x, w.y);
            mma_m16n8k16_f16(d, lo[s].z, hi[s].z, lo[s].w, hi[s].w, w.z, w.w);
          } else {
            mma_m16n8k16_f16_low(d, lo[s].x, lo[s].y, w.x, w.y);
            mma_m16n8k16_f16_low(d, lo[s].z, lo[s].w, w.z, w.w);
          }
        }
      }
      if constexpr (!kNvfp4) {
        const float* scales = static_cast<const float*>(job.scales);
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          const float s0 = __ldg(scales + fp8_scale_index(job, acc_row[t][0], unit, col_blocks));
          const float s1 = __ldg(scales + fp8_scale_index(job, acc_row[t][1], unit, col_blocks));
          add_block_scaled(acc, part, t, s0, s1);
        }
      }
    }
    __syncwarp();  // this warp is done with the slot
    if (lane == 0) mbarrier_arrive(&empty[slot]);
    if (stage == num_stages - 1) {
      // The tile's sums in warp order (deterministic); the second barrier keeps a warp that
      // runs ahead from writing the next tile's partial sums before these are read.
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp * kValues + (t * 4 + i) * 32 + lane] = acc[t][i];
      consumers_sync<32 * kWarps>();
      // (x · 2^-8 staged; NVFP4 codes · 2^-14): powers of two, so the order of the scalings is exact
      write_quant_tile<kNvfp4, kRowTiles, kWarps, 16>(table, job, partial, row0, m,
                                                      (1.0f / kStagedXScale) * (kNvfp4 ? kRingNvfp4Unscale : 1.0f));
      consumers_sync<32 * kWarps>();
    }
  }
}

}  // namespace ninfer::cuda::kernels
