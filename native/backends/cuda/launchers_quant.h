// Host entry points of the FP8/NVFP4 weight kernels (kernels_gemv_quant.cuh): decode GEMV,
// dequantization to bf16 (prefill and expert stacks) and seeded random quantized weights.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda {

inline constexpr int kQuantGemvMaxJobs = 4;

// One FP8/NVFP4 weight of a launch (backends/quantized_weight.h's Weight, on the device).
struct QuantGemvJob {
  const uint8_t* codes = nullptr;  // row 0 of this weight: k bytes (fp8) or k/2 (nvfp4) a row
  const void* scales = nullptr;    // of the whole tensor: fp8 f32 [groups, row_blocks, col_blocks]; nvfp4 e4m3 [rows, k/16]
  const float* scale2 = nullptr;   // nvfp4: f32 per row of the whole tensor
  const float* bias = nullptr;
  float* y = nullptr;              // [m, rows]
  int32_t rows = 0, group_rows = 0, first_row = 0;
};

// y_j[m, rows_j] (+)= x[m, k] · w_j^T (+ bias_j) for up to kQuantGemvMaxJobs weights of one
// format and width k; 1 <= m <= 16, k % 16 == 0 (fp8) or k % 32 == 0 (nvfp4).
void launch_gemv_quant(bool nvfp4, const QuantGemvJob* jobs, int num_jobs, const float* x, int m, int k,
                       bool accumulate, bool overlap_previous, cudaStream_t stream);
// Variants of launch_gemv_quant's kernel (tests and benchmarks): variant % 4 picks the tiles
// (0 = the launcher's choice, 1 = 8-row tiles, 2 = 16-row tiles of 4 warps, 3 = 16-row tiles
// of 8 warps), variant / 4 the software pipelining (0 = default, 1 = off, 2 = on); 12 and 13:
// the staged fp16 kernel for m <= 8 (kernels_gemv_quant_staged.cuh) with 8- and 16-row tiles,
// which variant 0 takes where x fits its shared memory. 16-21: the ring kernel
// (kernels_gemv_quant_ring.cuh: weights streamed by the bulk-copy engine through shared
// memory), 16 + 2·r + s with tiles of 8·2^r rows (r = 0, 1, 2) and x staged in shared memory
// (s = 1, where x fits beside 3 stages) or converted by each warp (s = 0); it needs 16-byte
// aligned rows and, for NVFP4, k % 256 == 0. Variant 0 takes the variant measured fastest for
// the 27B decode shapes (gemv_quant_measured.inc), else the ring kernel for m > 8, else the
// general/staged rule. NINFER_QUANT_GEMV_VARIANT=N makes variant 0 take variant N wherever N
// applies; NINFER_QUANT_GEMV_TABLE="fmt/m/k/rows=N,..." does so per shape (benchmarks).
void launch_gemv_quant_variant(int variant, bool nvfp4, const QuantGemvJob* jobs, int num_jobs, const float* x, int m,
                               int k, bool accumulate, bool overlap_previous, cudaStream_t stream);

// out[rows, k] = bf16 of the job's weight (its rows, from its first_row).
void launch_dequantize_bf16(bool nvfp4, const QuantGemvJob& weight, int k, uint16_t* out, cudaStream_t stream);

// A whole stored FP8/NVFP4 tensor (codes and scales, docs/artifact-format.md) of seeded
// uniform(-scale, scale) values quantized on the device: fp8 codes e4m3(448·u) under block
// scales scale/448; nvfp4 codes e2m1(6·u) under group scales 448 and row scales scale/2688.
void launch_random_quantized(bool nvfp4, uint8_t* blob, int64_t rows, int64_t cols, int64_t group_rows,
                             uint64_t seed, float scale, cudaStream_t stream);

}  // namespace ninfer::cuda
