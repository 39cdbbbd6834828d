// Launchers of the sector-shaped quantized GEMV (launchers_gemv_quant_sectors.h), in a
// translation unit of their own: 48 kernel instances.
#include "backends/cuda/launchers_gemv_quant_sectors.h"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "backends/cuda/kernels_gemv_quant_sectors.cuh"
#include "backends/cuda/launch_overlapped.h"

namespace ninfer::cuda {

namespace {

using kernels::SectorShape;

// Rows per tile, warps per block, 128-k units in flight per warp (tools/gpu/probes/
// quant_gemv_probe.cu timed shapes 0-5 on the 27B decode shapes; bench/RESULTS.md 2026-12-02);
// shapes 6-11 double-buffer each warp's loads (SectorShape's kDoubleBuffer).
using Shapes = std::tuple<SectorShape<2, 4, 2>, SectorShape<2, 4, 4>, SectorShape<4, 4, 2>, SectorShape<1, 4, 4>,
                          SectorShape<2, 8, 2>, SectorShape<1, 8, 4>, SectorShape<2, 4, 2, true>,
                          SectorShape<2, 4, 1, true>, SectorShape<1, 4, 2, true>, SectorShape<2, 8, 1, true>,
                          SectorShape<1, 8, 2, true>, SectorShape<4, 4, 1, true>>;
static_assert(std::tuple_size_v<Shapes> == kGemvQuantSectorsShapes);
template <int kShape>
using ShapeAt = std::tuple_element_t<kShape, Shapes>;

template <size_t... kShape>
constexpr std::array<int, sizeof...(kShape)> tile_rows_of(std::index_sequence<kShape...>) {
  return {ShapeAt<kShape>::kTileRows...};
}
constexpr auto kTileRows = tile_rows_of(std::make_index_sequence<kGemvQuantSectorsShapes>());

size_t checked_shape(int shape) {
  if (shape < 0 || shape >= kGemvQuantSectorsShapes) throw std::invalid_argument("gemv_quant_sectors: no such shape");
  return static_cast<size_t>(shape);
}

template <bool kNvfp4, typename Shape>
void launch(const kernels::QuantGemvTable& table, const float* x, int m, int k, bool overlap, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(table.first_tile[table.num_jobs])), block(Shape::kThreads);
  if (m > 8)
    launch_overlapped(overlap, grid, block, 0, stream, kernels::gemv_quant_sectors<kNvfp4, Shape, true>, table, x, m, k);
  else
    launch_overlapped(overlap, grid, block, 0, stream, kernels::gemv_quant_sectors<kNvfp4, Shape, false>, table, x, m,
                      k);
}

using Launcher = void (*)(const kernels::QuantGemvTable&, const float*, int, int, bool, cudaStream_t);
template <bool kNvfp4, size_t... kShape>
constexpr std::array<Launcher, sizeof...(kShape)> launchers_of(std::index_sequence<kShape...>) {
  return {&launch<kNvfp4, ShapeAt<kShape>>...};
}

template <bool kNvfp4>
void launch_shape(int shape, const kernels::QuantGemvTable& table, const float* x, int m, int k, bool overlap,
                  cudaStream_t stream) {
  static constexpr auto kLaunchers = launchers_of<kNvfp4>(std::make_index_sequence<kGemvQuantSectorsShapes>());
  kLaunchers[checked_shape(shape)](table, x, m, k, overlap, stream);
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
  return kTileRows[checked_shape(shape)];
}

void launch_gemv_quant_sectors(int shape, bool nvfp4, const kernels::QuantGemvTable& table, const float* x, int m,
                               int k, bool overlap, cudaStream_t stream) {
  if (nvfp4)
    launch_shape<true>(shape, table, x, m, k, overlap, stream);
  else
    launch_shape<false>(shape, table, x, m, k, overlap, stream);
}

}  // namespace ninfer::cuda
