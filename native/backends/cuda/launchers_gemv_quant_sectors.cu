// Launchers of the sector-shaped quantized GEMV (launchers_gemv_quant_sectors.h), in a
// translation unit of their own: 48 kernel instances.
#include "backends/cuda/launchers_gemv_quant_sectors.h"

#include <cstdint>
#include <stdexcept>

#include "backends/cuda/kernels_gemv_quant_sectors.cuh"
#include "backends/cuda/launch_overlapped.h"

namespace ninfer::cuda {

namespace {

using kernels::SectorShape;

// Rows per tile, warps per block, 128-k units in flight per warp (tools/gpu/probes/
// quant_gemv_probe.cu timed shapes 0-5 on the 27B decode shapes; bench/RESULTS.md 2026-12-02);
// shapes 6-11 double-buffer each warp's loads (SectorShape's kDoubleBuffer).
using Shape0 = SectorShape<2, 4, 2>;
using Shape1 = SectorShape<2, 4, 4>;
using Shape2 = SectorShape<4, 4, 2>;
using Shape3 = SectorShape<1, 4, 4>;
using Shape4 = SectorShape<2, 8, 2>;
using Shape5 = SectorShape<1, 8, 4>;
using Shape6 = SectorShape<2, 4, 2, true>;
using Shape7 = SectorShape<2, 4, 1, true>;
using Shape8 = SectorShape<1, 4, 2, true>;
using Shape9 = SectorShape<2, 8, 1, true>;
using Shape10 = SectorShape<1, 8, 2, true>;
using Shape11 = SectorShape<4, 4, 1, true>;
constexpr int kTileRows[kGemvQuantSectorsShapes] = {
    Shape0::kTileRows, Shape1::kTileRows, Shape2::kTileRows, Shape3::kTileRows,  Shape4::kTileRows,  Shape5::kTileRows,
    Shape6::kTileRows, Shape7::kTileRows, Shape8::kTileRows, Shape9::kTileRows, Shape10::kTileRows, Shape11::kTileRows};

template <bool kNvfp4, typename Shape>
void launch(const kernels::QuantGemvTable& table, const float* x, int m, int k, bool overlap, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(table.first_tile[table.num_jobs])), block(Shape::kThreads);
  if (m > 8)
    launch_overlapped(overlap, grid, block, 0, stream, kernels::gemv_quant_sectors<kNvfp4, Shape, true>, table, x, m, k);
  else
    launch_overlapped(overlap, grid, block, 0, stream, kernels::gemv_quant_sectors<kNvfp4, Shape, false>, table, x, m,
                      k);
}

template <bool kNvfp4>
void launch_shape(int shape, const kernels::QuantGemvTable& table, const float* x, int m, int k, bool overlap,
                  cudaStream_t stream) {
  switch (shape) {
    case 0: return launch<kNvfp4, Shape0>(table, x, m, k, overlap, stream);
    case 1: return launch<kNvfp4, Shape1>(table, x, m, k, overlap, stream);
    case 2: return launch<kNvfp4, Shape2>(table, x, m, k, overlap, stream);
    case 3: return launch<kNvfp4, Shape3>(table, x, m, k, overlap, stream);
    case 4: return launch<kNvfp4, Shape4>(table, x, m, k, overlap, stream);
    case 5: return launch<kNvfp4, Shape5>(table, x, m, k, overlap, stream);
    case 6: return launch<kNvfp4, Shape6>(table, x, m, k, overlap, stream);
    case 7: return launch<kNvfp4, Shape7>(table, x, m, k, overlap, stream);
    case 8: return launch<kNvfp4, Shape8>(table, x, m, k, overlap, stream);
    case 9: return launch<kNvfp4, Shape9>(table, x, m, k, overlap, stream);
    case 10: return launch<kNvfp4, Shape10>(table, x, m, k, overlap, stream);
    case 11: return launch<kNvfp4, Shape11>(table, x, m, k, overlap, stream);
    default: throw std::invalid_argument("launch_gemv_quant_sectors: no such shape");
  }
}

}  // namespace

bool gemv_quant_sectors_fit(const QuantGemvJob* jobs, int num_jobs, int k) {
  if (k % 128 != 0) return false;
  for (int j = 0; j < num_jobs; ++j)
    if (reinterpret_cast<uintptr_t>(jobs[j].codes) % 16 != 0 || reinterpret_cast<uintptr_t>(jobs[j].scales) % 4 != 0)
      return false;
  return true;
}

int gemv_quant_sectors_tile_rows(int shape) {
  if (shape < 0 || shape >= kGemvQuantSectorsShapes) throw std::invalid_argument("gemv_quant_sectors: no such shape");
  return kTileRows[shape];
}

void launch_gemv_quant_sectors(int shape, bool nvfp4, const kernels::QuantGemvTable& table, const float* x, int m,
                               int k, bool overlap, cudaStream_t stream) {
  if (nvfp4)
    launch_shape<true>(shape, table, x, m, k, overlap, stream);
  else
    launch_shape<false>(shape, table, x, m, k, overlap, stream);
}

}  // namespace ninfer::cuda
