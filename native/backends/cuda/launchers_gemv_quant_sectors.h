// The sector-shaped quantized GEMV (kernels_gemv_quant_sectors.cuh), launched from
// launchers_gemv_quant.cu as variants kGemvQuantSectorsFirstVariant + shape.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/launchers_quant.h"

namespace ninfer::cuda::kernels {
struct QuantGemvTable;
}

namespace ninfer::cuda {

inline constexpr int kGemvQuantSectorsFirstVariant = 24;
inline constexpr int kGemvQuantSectorsShapes = 12;

// Whether the kernel takes these weights: k % 128 == 0 and 16-byte aligned codes.
bool gemv_quant_sectors_fit(const QuantGemvJob* jobs, int num_jobs, int k);

// Rows per tile of shape s (0 <= s < kGemvQuantSectorsShapes).
int gemv_quant_sectors_tile_rows(int shape);

// Launch shape s over `table` (its first_tile filled for gemv_quant_sectors_tile_rows(s)).
void launch_gemv_quant_sectors(int shape, bool nvfp4, const kernels::QuantGemvTable& table, const float* x, int m,
                               int k, bool overlap, cudaStream_t stream);

}  // namespace ninfer::cuda
