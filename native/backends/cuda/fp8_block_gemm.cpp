#include "backends/cuda/fp8_block_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <cstring>
#include <stdexcept>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers_fp8_prefill.h"
#include "backends/cuda/launchers_quant.h"
#include "common/dtype.h"

namespace ninfer::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int64_t kMinRows = 16;     // cuBLASLt refuses block-scaled GEMMs of fewer rows
constexpr size_t kMaxPlans = 256;    // distinct prefill chunk sizes are few; bound them anyway

int64_t round_up4(int64_t v) { return (v + 3) / 4 * 4; }

// The largest power of two (at most 256) that every pointer's address is a multiple of: the
// heuristic only offers algorithms that work at that alignment.
uint32_t alignment_of(std::initializer_list<const void*> pointers) {
  uint32_t a = 256;
  for (const void* p : pointers)
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// Where rows [first_row, first_row + rows) of the weight's stack start in its fp8 block-scale
// tensor ([groups, row_blocks, col_blocks]), or -1 when they do not start on a block of one
// matrix (then the scales cannot be handed to cuBLASLt as they are).
int64_t fp8_scale_row(const Weight& w) {
  const int64_t group_rows = w.group_rows > 0 ? w.group_rows : w.rows;
  const int64_t g = w.first_row / group_rows, local = w.first_row % group_rows;
  if (local % kFp8Block != 0 || local + w.rows > group_rows) return -1;
  const int64_t row_blocks = (group_rows + kFp8Block - 1) / kFp8Block;
  return g * row_blocks + local / kFp8Block;
}

QuantGemvJob job_of(const Weight& w) {
  return {static_cast<const uint8_t*>(w.data), w.scales, w.scale2, nullptr, nullptr, static_cast<int32_t>(w.rows),
          static_cast<int32_t>(w.group_rows > 0 ? w.group_rows : w.rows), static_cast<int32_t>(w.first_row)};
}

}  // namespace

bool nvfp4_prefill_via_fp8() {
  const char* v = std::getenv("NINFER_NVFP4_PREFILL");
  return v && std::strcmp(v, "fp8") == 0;
}

bool fp8_fused_producers_enabled() {
  const char* v = std::getenv("NINFER_FP8_FUSED");
  return !(v && v[0] == '0');
}

bool fp8_gemm_enabled() {
  // On by default: on the H200 it is within its float64 bound and a model prefilled through it
  // follows the CPU's W8A8 mirror (bench/RESULTS.md, 2026-12-02 session 2).
  const char* v = std::getenv("NINFER_FP8_GEMM");
  return !(v && v[0] == '0');
}

Fp8BlockGemm::Fp8BlockGemm(cudaStream_t stream) : stream_(stream) {
  handle_ = CublasLtRuntime::get().create_handle();
}

Fp8BlockGemm::~Fp8BlockGemm() {
  cudaStreamSynchronize(stream_);
  for (auto& [key, p] : plans_) CublasLtRuntime::get().destroy_plan(p.lt);
  forget_weights();
  CublasLtRuntime::get().destroy_handle(handle_);
}

bool Fp8BlockGemm::available() { return CublasLtRuntime::get().available(); }
const std::string& Fp8BlockGemm::why() { return CublasLtRuntime::get().why(); }

bool Fp8BlockGemm::accepts(const Weight& w, int64_t m, bool nvfp4) {
  if (m < kMinRows || w.cols % kFp8Block != 0 || w.rows % 4 != 0 || w.rows < 1) return false;
  if (w.dtype == DType::FP8) return fp8_scale_row(w) >= 0;
  return nvfp4 && w.dtype == DType::NVFP4;
}

Fp8ActivationSink Fp8BlockGemm::activation_sink(int64_t m, int64_t k) {
  if (m < kMinRows || k % kFp8Block != 0) throw std::invalid_argument("Fp8BlockGemm: m >= 16 and k % 128 == 0");
  const int64_t main = m & ~int64_t(3), groups = k / kFp8Block;
  Fp8ActivationSink sink;
  sink.codes = static_cast<uint8_t*>(x_codes_buf_.get(static_cast<size_t>(m * k), stream_));
  sink.scales = static_cast<float*>(x_scales_buf_.get(static_cast<size_t>(groups * main) * 4, stream_));
  sink.ld = main;
  if (main != m) {
    sink.tail_scales = static_cast<float*>(tail_scales_buf_.get(static_cast<size_t>(groups * kMinRows) * 4, stream_));
    sink.tail_first = m - kMinRows;
  }
  sink.m = m, sink.k = k;
  x_codes_ = sink.codes, x_scales_ = sink.scales, tail_scales_ = sink.tail_scales, m_ = m, k_ = k;
  return sink;
}

void Fp8BlockGemm::quantize_activations(const float* x, int64_t m, int64_t k) {
  launch_quantize_fp8_activations(x, activation_sink(m, k), stream_);
}

Fp8BlockGemm::Plan& Fp8BlockGemm::plan(int64_t m, int64_t n, int64_t k, uint32_t alignment) {
  const auto key = std::make_tuple(m, n, k, alignment);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  if (plans_.size() >= kMaxPlans) {
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& [old, p] : plans_) CublasLtRuntime::get().destroy_plan(p.lt);
    plans_.clear();
  }
  Plan& p = plans_[key];
  const auto& lt = CublasLtRuntime::get();
  // The workspace stands in for the scale tensors while the heuristic runs (256-byte aligned).
  const void* placeholder = workspace_.get(kWorkspaceBytes, stream_);
  // f32 output first (what the backend's activations are), then bf16 plus a widening pass;
  // each with the weight as cuBLASLt's A (y comes out row-major) and then, should that pairing
  // of scale modes be refused, with x as A (y comes out transposed and a pass turns it).
  std::string refused;
  for (const bool x_first : {false, true}) {
    if (force_x_first_ && !x_first) continue;
    for (const cudaDataType_t type : {CUDA_R_32F, CUDA_R_16BF}) {
      const int64_t ld = x_first ? m : n;  // of the output: rows of 16 bytes
      if (ld % (type == CUDA_R_32F ? 4 : 8) != 0) continue;
      const std::string why =
          lt.plan_fp8_block(handle_, m, n, k, type, x_first, kWorkspaceBytes, alignment, placeholder, p.lt);
      if (why.empty()) {
        p.y_type = type;
        return p;
      }
      refused += (refused.empty() ? "" : "; ") + why + (type == CUDA_R_16BF ? " [bf16 out]" : "");
    }
  }
  p.refused = refused;
  return p;
}

const float* Fp8BlockGemm::weight_scales(const Weight& w) {
  const int64_t cb = w.cols / kFp8Block, ld = round_up4(cb), nb = (w.rows + kFp8Block - 1) / kFp8Block;
  const float* base = static_cast<const float*>(w.scales) + fp8_scale_row(w) * cb;
  // Used in place when already in cuBLASLt's layout and as aligned as the plans assumed.
  if (ld == cb && reinterpret_cast<uintptr_t>(base) % 256 == 0) return base;
  const auto key = std::make_pair(static_cast<const void*>(base), nb);
  if (auto it = padded_scales_.find(key); it != padded_scales_.end()) return it->second;
  float* padded = nullptr;
  NINFER_CUDA_CHECK(cudaMalloc(&padded, static_cast<size_t>(nb * ld) * 4));
  NINFER_CUDA_CHECK(cudaMemsetAsync(padded, 0, static_cast<size_t>(nb * ld) * 4, stream_));
  NINFER_CUDA_CHECK(cudaMemcpy2DAsync(padded, static_cast<size_t>(ld) * 4, base, static_cast<size_t>(cb) * 4,
                                      static_cast<size_t>(cb) * 4, static_cast<size_t>(nb), cudaMemcpyDeviceToDevice,
                                      stream_));
  padded_scales_[key] = padded;
  return padded;
}

void Fp8BlockGemm::forget_weights() {
  if (padded_scales_.empty()) return;
  cudaStreamSynchronize(stream_);
  for (auto& [key, p] : padded_scales_) cudaFree(p);
  padded_scales_.clear();
}

std::pair<const uint8_t*, const float*> Fp8BlockGemm::requantize(const Weight& w) {
  if (w.dtype != DType::NVFP4 || w.cols % kFp8Block != 0)
    throw std::invalid_argument("Fp8BlockGemm::requantize: an NVFP4 weight with k % 128 == 0");
  const int64_t n = w.rows, k = w.cols, ld = round_up4(k / kFp8Block), nb = (n + kFp8Block - 1) / kFp8Block;
  auto* bf16 = static_cast<uint16_t*>(w_bf16_.get(static_cast<size_t>(n * k) * 2, stream_));
  auto* codes = static_cast<uint8_t*>(w_codes_.get(static_cast<size_t>(n * k), stream_));
  auto* scales = static_cast<float*>(w_scales_.get(static_cast<size_t>(nb * ld) * 4, stream_));
  launch_dequantize_bf16(true, job_of(w), static_cast<int>(k), bf16, stream_);
  launch_requantize_bf16_to_fp8_blocks(bf16, n, k, codes, scales, ld, stream_);
  return {codes, scales};
}

bool Fp8BlockGemm::matmul(const Weight& w, float* y) {
  if (!x_codes_ || w.cols != k_) throw std::logic_error("Fp8BlockGemm::matmul: quantize_activations first");
  if (!accepts(w, m_, true)) throw std::invalid_argument("Fp8BlockGemm::matmul: weight not accepted");
  // Refuse before converting anything: both GEMM shapes must have a plan. An NVFP4 weight's
  // codes land in this object's (256-byte aligned) scratch.
  const void* codes = w.dtype == DType::FP8 ? w.data : nullptr;
  for (const auto& [rows, a] : gemms(codes, y, w.rows)) {
    if (const Plan& p = plan(rows, w.rows, k_, a); !p.refused.empty()) {
      refusal_ = p.refused;
      return false;
    }
  }
  if (w.dtype == DType::NVFP4) {
    const auto [q, scales] = requantize(w);
    run(q, scales, w.rows, y);
  } else {
    run(static_cast<const uint8_t*>(w.data), weight_scales(w), w.rows, y);
  }
  return true;
}

std::vector<std::pair<int64_t, uint32_t>> Fp8BlockGemm::gemms(const void* w_codes, const float* y, int64_t n) const {
  // The first m & ~3 rows, then (m % 4 != 0) the last 16 rows; each with its pointers' alignment.
  const int64_t main = m_ & ~int64_t(3);
  std::vector<std::pair<int64_t, uint32_t>> out;
  out.emplace_back(main, alignment_of({w_codes, x_codes_, y}));
  if (main != m_)
    out.emplace_back(kMinRows, alignment_of({w_codes, x_codes_ + (m_ - kMinRows) * k_, y + (m_ - kMinRows) * n}));
  return out;
}

void Fp8BlockGemm::run(const uint8_t* w_codes, const float* w_scales, int64_t n, float* y) {
  const auto& lt = CublasLtRuntime::get();
  void* ws = workspace_.get(kWorkspaceBytes, stream_);
  const int64_t main = m_ & ~int64_t(3);
  auto gemm = [&](int64_t rows, uint32_t alignment, const uint8_t* x, const float* xs, float* out) {
    Plan& p = plan(rows, n, k_, alignment);
    if (!p.refused.empty()) throw std::runtime_error("Fp8BlockGemm: " + p.refused);
    if (p.y_type == CUDA_R_32F && !p.lt.x_first) {
      lt.run_fp8_block(handle_, p.lt, w_codes, w_scales, x, xs, out, ws, kWorkspaceBytes, stream_);
      return;
    }
    const bool bf16 = p.y_type == CUDA_R_16BF;
    void* staged = y_staged_.get(static_cast<size_t>(rows * n) * (bf16 ? 2 : 4), stream_);
    lt.run_fp8_block(handle_, p.lt, w_codes, w_scales, x, xs, staged, ws, kWorkspaceBytes, stream_);
    if (p.lt.x_first) launch_transpose_to_f32(staged, bf16, n, rows, out, stream_);  // [n, rows] -> [rows, n]
    else launch_bf16_to_f32(static_cast<const uint16_t*>(staged), out, rows * n, stream_);
  };
  const auto shapes = gemms(w_codes, y, n);
  gemm(main, shapes[0].second, x_codes_, x_scales_, y);
  if (main != m_)
    gemm(kMinRows, shapes[1].second, x_codes_ + (m_ - kMinRows) * k_, tail_scales_, y + (m_ - kMinRows) * n);
}

}  // namespace ninfer::cuda
