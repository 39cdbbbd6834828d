// The CUDA backend's FP8/NVFP4 weights: upload, random weights and matmuls.
//
// Dense weights stay in their stored format on the device: decode-sized batches (m <= 16) run
// the dequantizing GEMV (W8A16 / W4A16). Larger ones (prefill): FP8 weights run cuBLASLt's
// block-scaled FP8 GEMM on activations quantized per token and 128 columns (W8A8,
// fp8_block_gemm.h) — by the quantizer, or, for an MLP's down projection and the GDN output
// projection, by the kernel that computes them (swiglu_matmul, gdn_mixer_projected); NVFP4
// weights, and FP8 shapes that path does not take (k % 128 != 0, or NINFER_FP8_GEMM=0), dequantize the weight into a bf16 scratch and run the bf16 cuBLAS GEMM
// (NINFER_NVFP4_PREFILL=fp8 sends NVFP4 through the FP8 GEMM after a lossy re-quantization).
// Expert stacks stay in their stored format too: decode reads them quantized, the grouped
// prefill GEMMs dequantize them per call (cuda_backend_moe_fused.cpp).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "artifact/artifact.h"
#include "backends/cuda/cublas_runtime.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_block_gemm.h"
#include "backends/cuda/launchers_fp8_prefill.h"
#include "backends/cuda/launchers_quant.h"
#include "backends/quantized_weight.h"

namespace ninfer::cuda {

namespace {

QuantGemvJob job_of(const Weight& w, const float* bias, float* y) {
  return {static_cast<const uint8_t*>(w.data), w.scales, w.scale2, bias, y, static_cast<int32_t>(w.rows),
          static_cast<int32_t>(w.group_rows), static_cast<int32_t>(w.first_row)};
}

}  // namespace

Weight CudaBackend::upload_quantized(const TensorView& t, int64_t rows, int64_t cols) {
  const int64_t group_rows = std::min(t.group_rows, rows);
  if (group_rows < 1 || rows % group_rows != 0)
    throw std::runtime_error("tensor '" + t.name + "': rows are not a whole number of matrices");
  if (const std::string problem = quantized_shape_problem(t.dtype, cols); !problem.empty())
    throw std::runtime_error("tensor '" + t.name + "': " + problem);
  if (static_cast<uint64_t>(QuantizedLayout::of(t.dtype, rows, cols, group_rows).nbytes) != t.nbytes)
    throw std::runtime_error("tensor '" + t.name + "': byte size does not match its shape");
  activate();
  void* dst = arena_alloc(t.nbytes);
  NINFER_CUDA_CHECK(cudaMemcpy(dst, t.data, t.nbytes, cudaMemcpyHostToDevice));
  return quantized_weight_at(t.dtype, rows, cols, group_rows, dst);
}

Weight CudaBackend::random_quantized_weight(DType dtype, int64_t rows, int64_t cols, int64_t group_rows,
                                            uint64_t seed, float scale) {
  if (!is_block_quantized(dtype)) return random_weight(rows, cols, seed, scale);
  if (const std::string problem = quantized_shape_problem(dtype, cols); !problem.empty())
    throw std::invalid_argument("random_quantized_weight: " + problem);
  activate();
  const QuantizedLayout layout = QuantizedLayout::of(dtype, rows, cols, group_rows);
  auto* blob = static_cast<uint8_t*>(arena_alloc(static_cast<size_t>(layout.nbytes)));
  launch_random_quantized(dtype == DType::NVFP4, blob, rows, cols, group_rows, seed, scale, stream_);
  return quantized_weight_at(dtype, rows, cols, group_rows, blob);
}

Fp8BlockGemm* CudaBackend::fp8_gemm_taking(const Weight& w, int64_t m) {
  if (!fp8_gemm_enabled() || !Fp8BlockGemm::accepts(w, m, nvfp4_prefill_via_fp8())) return nullptr;
  if (!fp8_gemm_tried_) {
    fp8_gemm_tried_ = true;
    if (Fp8BlockGemm::available()) fp8_gemm_ = std::make_shared<Fp8BlockGemm>(stream_);
  }
  return fp8_gemm_.get();
}

void CudaBackend::swiglu_matmul(float* gate, const float* up, int64_t rows, const Weight& down, float* y) {
  if (rows > 16 && is_block_quantized(down.dtype) && fp8_fused_producers_enabled()) {
    note(-18);
    if (dry()) return;
    activate();
    if (Fp8BlockGemm* fp8 = fp8_gemm_taking(down, rows)) {
      // The product goes straight into the GEMM's e4m3 operand: no f32 [rows, ff] written and
      // read back by the quantizer (the same codes, see launch_swiglu_to_fp8_activations).
      launch_swiglu_to_fp8_activations(gate, up, fp8->activation_sink(rows, down.cols), stream_);
      if (fp8->matmul(down, y)) return;
    }
  }
  Backend::swiglu_matmul(gate, up, rows, down, y);
}

void CudaBackend::add_rms_norm_matmul(float* y, const float* x, int64_t rows, int64_t cols, const float* weight,
                                      float eps, float* normed, std::span<const MatmulOutput> outputs) {
  Fp8BlockGemm* fp8 = nullptr;
  if (rows > 16 && normed != y && normed != x && fp8_fused_producers_enabled() &&
      add_rms_norm_to_fp8_fits(y, x, weight, normed, cols)) {
    for (const auto& o : outputs)
      if (!fp8 && o.weight->cols == cols && is_block_quantized(o.weight->dtype)) fp8 = fp8_gemm_taking(*o.weight, rows);
  }
  if (!fp8) {
    Backend::add_rms_norm_matmul(y, x, rows, cols, weight, eps, normed, outputs);
    return;
  }
  note(-19);
  if (dry()) return;
  activate();
  std::vector<MatmulOutput> plain, quantized;
  for (const auto& o : outputs) (is_block_quantized(o.weight->dtype) ? quantized : plain).push_back(o);
  // bf16 weights of the same input (the GDN's a/b projections) that take cuBLAS at this size
  // read normed in bf16: the norm writes that too instead of a conversion pass.
  const bool plain_via_cublas = !plain.empty() && cublas_ && matmul_path_ != MatmulPath::Gemv &&
                                std::all_of(plain.begin(), plain.end(), [&](const MatmulOutput& o) {
                                  return o.weight->dtype == DType::BF16 && o.weight->cols == cols;
                                });
  auto* normed_bf16 =
      plain_via_cublas ? static_cast<uint16_t*>(x_bf16_.get(static_cast<size_t>(rows * cols) * 2, stream_)) : nullptr;
  // The norm writes the GEMM's e4m3 operand as well as normed (which any refused matmul reads):
  // no quantizer pass over normed (the same codes, see the launcher).
  launch_add_rms_norm_to_fp8_activations(y, x, weight, eps, normed, fp8->activation_sink(rows, cols), normed_bf16,
                                         stream_);
  if (normed_bf16)
    run_cublas_bf16(normed_bf16, rows, plain);
  else if (!plain.empty())
    matmul_many(normed, rows, plain);
  matmul_quantized(normed, rows, quantized, true);
}

void CudaBackend::matmul_quantized(const float* x, int64_t m, std::span<const MatmulOutput> outputs,
                                   bool x_quantized) {
  const int64_t k = outputs[0].weight->cols;
  for (const auto& o : outputs)
    if (o.weight->cols != k) throw std::invalid_argument("matmul_many: all weights need the same width");
  activate();
  if (m <= 16) {
    // Captured in decode graphs like the bf16 GEMV: the launch reads no host data that a
    // replay would not restage (weights, x and y are fixed buffers; the job table is a kernel
    // argument). Replays matched eager steps bit for bit on the H200 (2026-12-01,
    // tools/gpu/quant_graph_diag.py).
    note(-16);
    note(overlap_launches_);
    if (dry()) return;
    for (const DType dtype : {DType::FP8, DType::NVFP4}) {
      QuantGemvJob jobs[kQuantGemvMaxJobs];
      int n = 0;
      auto flush = [&] {
        if (n) launch_gemv_quant(dtype == DType::NVFP4, jobs, n, x, static_cast<int>(m), static_cast<int>(k), false,
                                 overlap_launches_, stream_);
        n = 0;
      };
      for (const auto& o : outputs) {
        if (o.weight->dtype != dtype) continue;
        jobs[n++] = job_of(*o.weight, o.bias, o.y);
        if (n == kQuantGemvMaxJobs) flush();
      }
      flush();
    }
    return;
  }
  note(-17);
  if (dry()) return;
  // FP8 weights (and NVFP4 ones when NINFER_NVFP4_PREFILL=fp8): x quantized once to e4m3 per
  // token and 128 columns, block-scaled FP8 GEMMs on the tensor cores (fp8_block_gemm.h).
  const bool nvfp4_fp8 = nvfp4_prefill_via_fp8();
  Fp8BlockGemm* fp8 = nullptr;
  for (const auto& o : outputs)
    if (!fp8) fp8 = fp8_gemm_taking(*o.weight, m);
  bool x_converted = false;
  uint16_t* xb = nullptr;
  for (const auto& o : outputs) {
    const Weight& w = *o.weight;
    if (fp8 && Fp8BlockGemm::accepts(w, m, nvfp4_fp8)) {
      if (!x_quantized) fp8->quantize_activations(x, m, k);
      x_quantized = true;
      if (fp8->matmul(w, o.y)) {
        if (o.bias) launch_add_bias(o.y, o.bias, m, w.rows, stream_);
        continue;
      }
    }
    if (!cublas_) {  // no cuBLAS: the GEMV, 16 rows of x at a time
      for (int64_t r0 = 0; r0 < m; r0 += 16) {
        const QuantGemvJob job = job_of(w, o.bias, o.y + r0 * w.rows);
        launch_gemv_quant(w.dtype == DType::NVFP4, &job, 1, x + r0 * k, static_cast<int>(std::min<int64_t>(16, m - r0)),
                          static_cast<int>(k), false, false, stream_);
      }
      continue;
    }
    auto* wb = static_cast<uint16_t*>(w_bf16_.get(static_cast<size_t>(w.rows * k) * 2, stream_));
    launch_dequantize_bf16(w.dtype == DType::NVFP4, job_of(w, nullptr, nullptr), static_cast<int>(k), wb, stream_);
    if (!x_converted) {  // once for all outputs of this call
      xb = static_cast<uint16_t*>(x_bf16_.get(static_cast<size_t>(m * k) * 2, stream_));
      launch_f32_to_bf16(x, xb, m * k, stream_);
      x_converted = true;
    }
    CublasRuntime::get().gemm_bf16_rowmajor(cublas_, xb, wb, o.y, static_cast<int>(m), static_cast<int>(w.rows),
                                            static_cast<int>(k));
    if (o.bias) launch_add_bias(o.y, o.bias, m, w.rows, stream_);
  }
}

}  // namespace ninfer::cuda
