// Launchers of the sector-shaped quantized GEMV (launchers_gemv_quant_sectors.h), in a
// translation unit of their own: 72 kernel instances.
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
// shapes 6-11 double-buffer each warp's loads (SectorShape's kDoubleBuffer); shapes 12-17 split
// each tile's units over 2 or 4 blocks (kSplits: for weights of few rows, e.g. mlp down).
using Shapes =
    std::tuple<SectorShape<2, 4, 2>, SectorShape<2, 4, 4>, SectorShape<4, 4, 2>, SectorShape<1, 4, 4>,
               SectorShape<2, 8, 2>, SectorShape<1, 8, 4>, SectorShape<2, 4, 2, true>, SectorShape<2, 4, 1, true>,
               SectorShape<1, 4, 2, true>, SectorShape<2, 8, 1, true>, SectorShape<1, 8, 2, true>,
               SectorShape<4, 4, 1, true>, SectorShape<2, 4, 2, false, 2>, SectorShape<2, 4, 2, false, 4>,
               SectorShape<2, 4, 2, true, 2>, SectorShape<2, 4, 2, true, 4>, SectorShape<1, 4, 2, true, 2>,
               SectorShape<4, 4, 1, true, 4>>;
static_assert(std::tuple_size_v<Shapes> == kGemvQuantSectorsShapes);
template <int kShape>
using ShapeAt = std::tuple_element_t<kShape, Shapes>;

template <size_t... kShape>
constexpr std::array<int, sizeof...(kShape)> tile_rows_of(std::index_sequence<kShape...>) {
  return {ShapeAt<kShape>::kTileRows...};
}
constexpr auto kTileRows = tile_rows_of(std::make_index_sequence<kGemvQuantSectorsShapes>());
template <size_t... kShape>
constexpr std::array<int, sizeof...(kShape)> splits_of(std::index_sequence<kShape...>) {
  return {ShapeAt<kShape>::kSplits...};
}
constexpr auto kSplits = splits_of(std::make_index_sequence<kGemvQuantSectorsShapes>());

size_t checked_shape(int shape) {
  if (shape < 0 || shape >= kGemvQuantSectorsShapes) throw std::invalid_argument("gemv_quant_sectors: no such shape");
  return static_cast<size_t>(shape);
}

template <bool kNvfp4, typename Shape>
void launch(const kernels::QuantGemvTable& table, const float* x, int m, int k, const kernels::GemvWorkspace& ws,
            bool overlap, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(table.first_tile[table.num_jobs]), Shape::kSplits), block(Shape::kThreads);
  if (m > 8)
    launch_overlapped(overlap, grid, block, 0, stream, kernels::gemv_quant_sectors<kNvfp4, Shape, true>, table, x, m, k,
                      ws);
  else
    launch_overlapped(overlap, grid, block, 0, stream, kernels::gemv_quant_sectors<kNvfp4, Shape, false>, table, x, m,
                      k, ws);
}

using Launcher = void (*)(const kernels::QuantGemvTable&, const float*, int, int, const kernels::GemvWorkspace&, bool,
                          cudaStream_t);
template <bool kNvfp4, size_t... kShape>
constexpr std::array<Launcher, sizeof...(kShape)> launchers_of(std::index_sequence<kShape...>) {
  return {&launch<kNvfp4, ShapeAt<kShape>>...};
}

template <bool kNvfp4>
void launch_shape(int shape, const kernels::QuantGemvTable& table, const float* x, int m, int k,
                  const kernels::GemvWorkspace& ws, bool overlap, cudaStream_t stream) {
  static constexpr auto kLaunchers = launchers_of<kNvfp4>(std::make_index_sequence<kGemvQuantSectorsShapes>());
  kLaunchers[checked_shape(shape)](table, x, m, k, ws, overlap, stream);
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

bool gemv_quant_sectors_split_fits(int shape, int tiles, int k, const GemvWorkspace* workspace) {
  const int splits = kSplits[checked_shape(shape)];
  if (splits == 1) return true;
  // A slot of 16 x rows per split block and a counter per tile (kSplitSlotFloats); the
  // workspace holds two 256-float slots and one counter per block of its grids.
  const int64_t slot_floats = int64_t(16) * kTileRows[static_cast<size_t>(shape)];
  return workspace && workspace->partials && workspace->counters && k / 128 >= splits &&
         int64_t(tiles) <= workspace->max_blocks &&
         int64_t(tiles) * splits * slot_floats <= workspace->max_blocks * 2 * 256;
}

void launch_gemv_quant_sectors(int shape, bool nvfp4, const kernels::QuantGemvTable& table, const float* x, int m,
                               int k, const GemvWorkspace* workspace, bool overlap, cudaStream_t stream) {
  if (!gemv_quant_sectors_split_fits(shape, table.first_tile[table.num_jobs], k, workspace))
    throw std::invalid_argument("gemv_quant_sectors: this split shape needs a (larger) GEMV workspace");
  const kernels::GemvWorkspace ws = workspace ? kernels::GemvWorkspace{workspace->partials, workspace->counters,
                                                                       workspace->max_blocks}
                                              : kernels::GemvWorkspace{};
  if (nvfp4)
    launch_shape<true>(shape, table, x, m, k, ws, overlap, stream);
  else
    launch_shape<false>(shape, table, x, m, k, ws, overlap, stream);
}

}  // namespace ninfer::cuda
