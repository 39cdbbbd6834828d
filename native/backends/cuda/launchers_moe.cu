// Launchers of the grouped MoE expert GEMMs (see launchers_moe.h).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_moe_grouped.cuh"
#include "backends/cuda/launchers.h"
#include "backends/cuda/launchers_hybrid.h"
#include "backends/cuda/launchers_moe.h"

namespace ninfer::cuda {

namespace {

using kernels::MoeGemmArgs;
using kernels::MoeGemmKind;
using kernels::MoeGemmShape;
using kernels::MoeTile;

int64_t pairs_of(const MoeGroupedJob& job) { return job.tokens * job.top_k; }

// Automatic choice (bench/bench_cuda_moe.py, 35B-A3B shape, H200): 128 x 256 tiles (8 warps of
// 64x64, ~166 KB of smem, one block per SM) from 48 rows per expert on (8192 tokens: 2.18 ms a
// layer against 2.32 for 128 x 128 and 2.50 for 64 x 128; 2048 tokens: 0.86 against 0.93 for
// 64 x 128), 32 x 128 below (256 tokens: 0.54 ms against 0.68 for 64 x 128, 0.77 for 128 x 256).
// The 64 x 128 and 128 x 128 shapes (4 warps, ~110 KB: two blocks per SM) remain selectable
// for that comparison.
using Rows128Wide = MoeGemmShape<128, 256, 64, 2, 4, 3, 1>;
using Rows128 = MoeGemmShape<128, 128, 64, 2, 2, 3, 2>;
using Rows64 = MoeGemmShape<64, 128, 64, 2, 2, 4, 2>;
using Rows32 = MoeGemmShape<32, 128, 64, 1, 4, 4, 2>;

int64_t rows_per_expert(const MoeGroupedJob& job) {
  return pairs_of(job) / std::max<int64_t>(job.num_experts, 1);
}

constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Upper bound of the tiles over all experts: every expert may end in a partial tile.
int64_t max_tiles(const MoeGroupedJob& job, int tile_rows) {
  const int64_t pairs = pairs_of(job);
  return (pairs + tile_rows - 1) / tile_rows + std::min(job.num_experts, pairs);
}

// The scratch carved into its parts.
struct Parts {
  uint16_t* x_bf16;
  int32_t* sorted_pair;
  MoeTile* tiles;
  int32_t* tile_count;
  uint16_t* act;
  float* y;
  size_t bytes;
};

Parts carve(const MoeGroupedJob& job, int tile_rows, void* scratch) {
  const int64_t pairs = pairs_of(job);
  auto* base = static_cast<unsigned char*>(scratch);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    unsigned char* p = base ? base + at : nullptr;
    at += align_up(std::max<size_t>(bytes, 4));
    return p;
  };
  Parts parts{};
  parts.x_bf16 = reinterpret_cast<uint16_t*>(take(size_t(job.tokens * job.hidden) * 2));
  parts.sorted_pair = reinterpret_cast<int32_t*>(take(size_t(pairs) * 4));
  parts.tiles = reinterpret_cast<MoeTile*>(take(size_t(max_tiles(job, tile_rows)) * sizeof(MoeTile)));
  parts.tile_count = reinterpret_cast<int32_t*>(take(4));
  parts.act = reinterpret_cast<uint16_t*>(take(size_t(pairs * job.ff) * 2));
  parts.y = reinterpret_cast<float*>(take(size_t(pairs * job.hidden) * 4));
  parts.bytes = at;
  return parts;
}

template <class Shape, MoeGemmKind KIND>
void launch_gemm(const MoeGemmArgs& args, unsigned int col_blocks, unsigned int tile_blocks, cudaStream_t stream) {
  static const bool configured = [] {  // > 48 KiB of dynamic shared memory needs opting in
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(kernels::moe_grouped_gemm<Shape, KIND>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
    return true;
  }();
  (void)configured;
  kernels::moe_grouped_gemm<Shape, KIND>
      <<<dim3(col_blocks, tile_blocks), Shape::kThreads, Shape::kSmemBytes, stream>>>(args);
  NINFER_CUDA_CHECK_LAUNCH();
}

template <class Shape>
void run_grouped(const MoeGroupedJob& job, const Parts& parts, cudaStream_t stream) {
  const int64_t pairs = pairs_of(job);
  const auto tile_blocks = static_cast<unsigned int>(max_tiles(job, Shape::kRows));
  kernels::moe_group_rows<<<1, kernels::kMoeGroupThreads, 0, stream>>>(
      job.expert_ids, static_cast<int>(pairs), static_cast<int>(job.num_experts), Shape::kRows, parts.sorted_pair,
      parts.tiles, parts.tile_count);
  NINFER_CUDA_CHECK_LAUNCH();

  MoeGemmArgs gate_up;
  gate_up.tiles = parts.tiles;
  gate_up.tile_count = parts.tile_count;
  gate_up.sorted_pair = parts.sorted_pair;
  gate_up.a = parts.x_bf16;
  gate_up.top_k = static_cast<int>(job.top_k);
  gate_up.w = job.gate_up;
  gate_up.expert_rows = 2 * job.ff;
  gate_up.n = static_cast<int>(job.ff);
  gate_up.k = static_cast<int>(job.hidden);
  gate_up.act = parts.act;
  const auto gate_up_cols = static_cast<unsigned int>((job.ff + Shape::kCols / 2 - 1) / (Shape::kCols / 2));
  launch_gemm<Shape, MoeGemmKind::GateUpSwiglu>(gate_up, gate_up_cols, tile_blocks, stream);

  MoeGemmArgs down = gate_up;
  down.a = parts.act;
  down.w = job.down;
  down.expert_rows = job.hidden;
  down.n = static_cast<int>(job.hidden);
  down.k = static_cast<int>(job.ff);
  down.act = nullptr;
  down.y = parts.y;
  const auto down_cols = static_cast<unsigned int>((job.hidden + Shape::kCols - 1) / Shape::kCols);
  launch_gemm<Shape, MoeGemmKind::Down>(down, down_cols, tile_blocks, stream);
}

}  // namespace

bool moe_grouped_supported(int64_t hidden, int64_t ff, int64_t num_experts) {
  return hidden > 0 && ff > 0 && hidden % kernels::kMoeKAlign == 0 && ff % kernels::kMoeKAlign == 0 &&
         num_experts > 0 && num_experts <= kernels::kMoeMaxExperts && hidden <= (1 << 20) && ff <= (1 << 20);
}

int moe_grouped_tile_rows(const MoeGroupedJob& job) {
  if (job.tile_rows != 0) return job.tile_rows;
  return rows_per_expert(job) >= 48 ? 128 : 32;
}

size_t moe_grouped_scratch_bytes(const MoeGroupedJob& job) {
  return carve(job, moe_grouped_tile_rows(job), nullptr).bytes;
}

void launch_moe_grouped_experts(const MoeGroupedJob& job, void* scratch, cudaStream_t stream) {
  if (job.tokens <= 0) return;
  if (!moe_grouped_supported(job.hidden, job.ff, job.num_experts) || job.top_k <= 0 || job.top_k > job.num_experts)
    throw std::invalid_argument("grouped MoE (CUDA): needs hidden and ff multiples of 8, at most 512 experts and "
                                "1 <= top_k <= experts");
  const int tile_rows = moe_grouped_tile_rows(job);
  const bool wide = job.tile_rows == 0 ? tile_rows == 128 : job.tile_cols == 256;
  if ((tile_rows != 32 && tile_rows != 64 && tile_rows != 128) || (job.tile_cols != 0 && job.tile_cols != 128 &&
                                                                   !(wide && tile_rows == 128)))
    throw std::invalid_argument("grouped MoE (CUDA): tiles must be 32, 64 or 128 rows by 128 columns, or 128 by 256");
  if (max_tiles(job, tile_rows) > 65535 || pairs_of(job) > (int64_t(1) << 30))
    throw std::invalid_argument("grouped MoE (CUDA): too many (token, slot) pairs for one launch");
  const Parts parts = carve(job, tile_rows, scratch);
  launch_f32_to_bf16(job.x, parts.x_bf16, job.tokens * job.hidden, stream);
  switch (tile_rows) {
    case 128:
      if (wide)
        run_grouped<Rows128Wide>(job, parts, stream);
      else
        run_grouped<Rows128>(job, parts, stream);
      break;
    case 64: run_grouped<Rows64>(job, parts, stream); break;
    default: run_grouped<Rows32>(job, parts, stream); break;
  }
  launch_moe_combine(parts.y, job.hidden, nullptr, job.route_weights, job.tokens, job.top_k, job.out, stream);
}

}  // namespace ninfer::cuda
