// Y[m, n] = X[m, k] · W[n, k]^T (+ bias): the weight-streaming op that dominates decode.
//
// Work is split over output columns (weight rows) so each thread streams a disjoint slice of
// the weights exactly once; for prefill, rows of X are processed in blocks so a weight chunk
// is reused from cache across the block. Q8_0 weights meet X quantized to int8 blocks.
// Several weights applied to the same X (q/k/v, gate/up) run as one job: one hand-off to the
// thread pool and one quantization of X instead of one per weight. FP8 and NVFP4 weights are
// the reference path (correctness, not speed): a task decodes its rows to f32, then runs the
// f32 tile. With NINFER_CPU_W8A8=1, X meets FP8 weights rounded the way the CUDA prefill GEMM
// rounds it (W8A8: e4m3 per token and 128 columns, scale amax / 448), the reference its GPU
// test compares with (tests/test_cuda_fp8_gemm.py).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/quantized_weight.h"
#include "cache/kv_format.h"

namespace ninfer::cpu {

namespace {

constexpr int64_t kRowBlock = 64;            // X rows per task: keeps the X block in L2
constexpr int64_t kChunkBytes = 256 * 1024;  // weight bytes per task at most: stays in L2

// Weight rows per task: a couple of long contiguous runs per thread, so each thread streams
// its share once with the kernels' software prefetch running ahead. With several X rows a run
// is re-read per row pair, so it is capped to stay in L2.
int64_t columns_per_task(int64_t m, int64_t n, int64_t weight_row_bytes, int threads) {
  int64_t chunk = std::max<int64_t>(16, (n + 2 * threads - 1) / (2 * threads));
  if (m > 2) chunk = std::min(chunk, std::max<int64_t>(16, kChunkBytes / std::max<int64_t>(weight_row_bytes, 1)));
  return (chunk + 3) / 4 * 4;
}

MatmulTileF32 float_tile(const CpuKernels& kernels, DType dtype) {
  switch (dtype) {
    case DType::F32: return kernels.tile_f32;
    case DType::F16: return kernels.tile_f16;
    case DType::BF16: return kernels.tile_bf16;
    case DType::Q8_0: case DType::FP8: case DType::NVFP4: return nullptr;
    case DType::I32: break;
  }
  throw std::invalid_argument("matmul: " + std::string(dtype_name(dtype)) + " weights are not supported");
}

// One output's split into (column chunk x row block) tasks.
struct OutputPlan {
  MatmulOutput out;
  MatmulTileF32 tile;       // null for q8_0, fp8 and nvfp4
  int64_t row_bytes;
  int64_t cols_per_task;
  int64_t col_tasks;
};

// Whether the CUDA backend would take w through its W8A8 FP8 GEMM for m rows
// (cuda::Fp8BlockGemm::accepts and the GEMV's m <= 16) and NINFER_CPU_W8A8 asks to mirror it.
bool mirrors_fp8_gemm(const Weight& w, int64_t m) {
  const char* on = std::getenv("NINFER_CPU_W8A8");  // read per call: tests switch it
  return on && on[0] == '1' && w.dtype == DType::FP8 && m > 16 && w.cols % 128 == 0 && w.rows % 4 == 0;
}

// x [m, k] as the FP8 GEMM sees it: per (row, 128 columns) s = amax / 448 (1 when all zero),
// each value e4m3(v / s) · s.
void round_like_fp8_gemm(const float* x, int64_t m, int64_t k, float* out) {
  for (int64_t i = 0; i < m * k; i += 128) {
    float amax = 0.0f;
    for (int64_t j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(x[i + j]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int64_t j = 0; j < 128; ++j)
      out[i + j] = kvcodec::e4m3_to_float(kvcodec::float_to_e4m3(x[i + j] / s)) * s;
  }
}

}  // namespace

void CpuBackend::matmul(const float* x, int64_t m, const Weight& w, const float* bias, float* y) {
  const MatmulOutput out{&w, bias, y};
  matmul_many(x, m, std::span(&out, 1));
}

void CpuBackend::matmul_many(const float* x, int64_t m, std::span<const MatmulOutput> outputs) {
  if (m <= 0 || outputs.empty()) return;
  const CpuKernels& kernels = cpu_kernels();
  const int64_t k = outputs[0].weight->cols;
  const int64_t row_tasks = (m + kRowBlock - 1) / kRowBlock;

  std::vector<OutputPlan> plans;
  std::vector<int64_t> first_task{0};
  bool any_q8 = false;
  for (const MatmulOutput& o : outputs) {
    const Weight& w = *o.weight;
    if (w.cols != k) throw std::invalid_argument("matmul_many: all weights must share the input width");
    if (w.rows <= 0) continue;
    OutputPlan plan{o, float_tile(kernels, w.dtype), row_bytes(w.dtype, k), 0, 0};
    plan.cols_per_task = columns_per_task(m, w.rows, plan.row_bytes, pool_.size());
    plan.col_tasks = (w.rows + plan.cols_per_task - 1) / plan.cols_per_task;
    any_q8 = any_q8 || w.dtype == DType::Q8_0;
    plans.push_back(plan);
    first_task.push_back(first_task.back() + plan.col_tasks * row_tasks);
  }

  const int64_t blocks_per_row = k / kQ8BlockSize;
  if (any_q8) {
    quantized_x_.resize(static_cast<size_t>(m * blocks_per_row));
    BlockQ8Act* dst = quantized_x_.data();
    pool_.parallel_ranges(m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) kernels.quantize_row_q8(x + i * k, k, dst + i * blocks_per_row);
    });
  }
  const BlockQ8Act* xq = quantized_x_.data();
  thread_local std::vector<float> x_w8a8;
  const bool w8a8 = std::any_of(plans.begin(), plans.end(), [&](const OutputPlan& p) {
    return mirrors_fp8_gemm(*p.out.weight, m);
  });
  if (w8a8) {
    x_w8a8.resize(static_cast<size_t>(m * k));
    round_like_fp8_gemm(x, m, k, x_w8a8.data());
  }
  const float* x8 = x_w8a8.data();

  pool_.parallel_for(first_task.back(), [&](int64_t task) {
    const size_t p = static_cast<size_t>(std::upper_bound(first_task.begin(), first_task.end(), task) -
                                         first_task.begin() - 1);
    const OutputPlan& plan = plans[p];
    const int64_t local = task - first_task[p];
    const int64_t n = plan.out.weight->rows;
    // Consecutive tasks share a weight chunk, so a thread tends to find it still cached.
    const int64_t c0 = (local / row_tasks) * plan.cols_per_task, r0 = (local % row_tasks) * kRowBlock;
    const int64_t nc = std::min(plan.cols_per_task, n - c0), nr = std::min(kRowBlock, m - r0);
    const uint8_t* wc = static_cast<const uint8_t*>(plan.out.weight->data) + c0 * plan.row_bytes;
    float* yc = plan.out.y + r0 * n + c0;
    if (is_block_quantized(plan.out.weight->dtype)) {
      thread_local std::vector<float> decoded;
      decoded.resize(static_cast<size_t>(nc * k));
      dequantize_rows(*plan.out.weight, c0, nc, decoded.data());
      const float* xs = mirrors_fp8_gemm(*plan.out.weight, m) ? x8 : x;
      kernels.tile_f32(xs + r0 * k, k, nr, decoded.data(), k * 4, nc, k, yc, n);
    } else if (plan.tile)
      plan.tile(x + r0 * k, k, nr, wc, plan.row_bytes, nc, k, yc, n);
    else
      kernels.tile_q8_0(xq + r0 * blocks_per_row, blocks_per_row, nr, wc, plan.row_bytes, nc, k, yc, n);
    if (const float* bias = plan.out.bias)
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) yc[i * n + j] += bias[c0 + j];
  });
}

}  // namespace ninfer::cpu
