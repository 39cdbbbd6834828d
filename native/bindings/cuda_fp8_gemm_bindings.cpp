// The FP8 prefill GEMM (backends/cuda/fp8_block_gemm.h) on numpy arrays (tests:
// tests/test_cuda_fp8_gemm.py) and device-timed at real shapes against the bf16 path it replaces
// (bench/bench_cuda_fp8_prefill.py).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "common/dtype.h"

#ifdef NINFER_WITH_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cublas_runtime.h"
#include "backends/cuda/cublaslt_runtime.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_block_gemm.h"
#include "backends/cuda/launchers.h"
#include "backends/cuda/launchers_fp8_prefill.h"
#include "backends/cuda/launchers_quant.h"
#include "backends/quantized_weight.h"
#endif

namespace py = pybind11;

namespace ninfer::bindings {

#ifdef NINFER_WITH_CUDA
namespace {

class Buffer {
 public:
  explicit Buffer(size_t bytes) { NINFER_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 256))); }
  ~Buffer() { cudaFree(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

DType dtype_of(const std::string& name) {
  if (name == "fp8") return DType::FP8;
  if (name == "nvfp4") return DType::NVFP4;
  throw py::value_error("dtype must be 'fp8' or 'nvfp4'");
}

template <typename T>
void check_array(const py::array& a, const char* what) {
  if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style))
    throw py::type_error(std::string(what) + ": expected a C-contiguous " + std::string(py::str(py::dtype::of<T>())) +
                         " array");
}

constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xa5;

class CudaFp8Gemm {
 public:
  CudaFp8Gemm(int device, bool x_first) : device_(device) {
    NINFER_CUDA_CHECK(cudaSetDevice(device));
    if (!cuda::Fp8BlockGemm::available()) throw std::runtime_error(cuda::Fp8BlockGemm::why());
    NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    gemm_ = std::make_unique<cuda::Fp8BlockGemm>(stream_);
    gemm_->force_x_first(x_first);
  }
  ~CudaFp8Gemm() {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    if (cublas_) cuda::CublasRuntime::get().destroy_handle(cublas_);
    if (raw_handle_) cuda::CublasLtRuntime::get().destroy_handle(raw_handle_);
    cudaStreamDestroy(stream_);
  }
  CudaFp8Gemm(const CudaFp8Gemm&) = delete;
  CudaFp8Gemm& operator=(const CudaFp8Gemm&) = delete;

  // (codes uint8 [m, k], scales f32 [m, k / 128]) of x as the GEMM's activation operand.
  py::tuple quantize(py::array x) {
    check_array<float>(x, "x");
    if (x.ndim() != 2) throw py::value_error("x: [m, k]");
    const int64_t m = x.shape(0), k = x.shape(1);
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    Buffer xd(x.nbytes());
    NINFER_CUDA_CHECK(cudaMemcpyAsync(xd.as<void>(), x.data(), x.nbytes(), cudaMemcpyHostToDevice, stream_));
    gemm_->quantize_activations(xd.as<float>(), m, k);
    return activations(m, k);
  }

  // The same of silu(gate) · up, quantized as it is computed (the fused MLP producer).
  py::tuple quantize_swiglu(py::array gate, py::array up) {
    check_array<float>(gate, "gate");
    check_array<float>(up, "up");
    if (gate.ndim() != 2 || up.ndim() != 2 || gate.shape(0) != up.shape(0) || gate.shape(1) != up.shape(1))
      throw py::value_error("gate, up: [m, k] each");
    const int64_t m = gate.shape(0), k = gate.shape(1);
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    Buffer gd(gate.nbytes()), ud(up.nbytes());
    NINFER_CUDA_CHECK(cudaMemcpyAsync(gd.as<void>(), gate.data(), gate.nbytes(), cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(ud.as<void>(), up.data(), up.nbytes(), cudaMemcpyHostToDevice, stream_));
    cuda::launch_swiglu_to_fp8_activations(gd.as<float>(), ud.as<float>(), gemm_->activation_sink(m, k), stream_);
    return activations(m, k);
  }

  // The same of the GDN output's gated RMSNorm of x, z [m, heads · dim] (dim = weight's size),
  // quantized as it is computed (the fused output-projection producer).
  py::tuple quantize_gated_rmsnorm(py::array x, py::array z, py::array weight, float eps) {
    check_array<float>(x, "x");
    check_array<float>(z, "z");
    check_array<float>(weight, "weight");
    if (x.ndim() != 2 || z.ndim() != 2 || x.shape(0) != z.shape(0) || x.shape(1) != z.shape(1) ||
        x.shape(1) % weight.size() != 0)
      throw py::value_error("x, z: [m, heads * dim] each, weight [dim]");
    const int64_t m = x.shape(0), k = x.shape(1), dim = weight.size();
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    Buffer xd(x.nbytes()), zd(z.nbytes()), wd(weight.nbytes());
    NINFER_CUDA_CHECK(cudaMemcpyAsync(xd.as<void>(), x.data(), x.nbytes(), cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(zd.as<void>(), z.data(), z.nbytes(), cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(wd.as<void>(), weight.data(), weight.nbytes(), cudaMemcpyHostToDevice, stream_));
    if (!cuda::gated_rmsnorm_to_fp8_fits(xd.as<float>(), zd.as<float>(), wd.as<float>(), dim))
      throw py::value_error("the fused gated norm takes head dims of 128, 256 or 512");
    cuda::launch_gated_rmsnorm_to_fp8_activations(xd.as<float>(), zd.as<float>(), k / dim, dim, wd.as<float>(), eps,
                                                  gemm_->activation_sink(m, k), stream_);
    return activations(m, k);
  }

  // The fused residual add + RMSNorm producer against the plain kernel on the same inputs:
  // (codes, scales, h + branch, y, y's bf16 bits) of the fused launch, then (h + branch, y) of
  // launch_add_rms_norm, every output starting as NaN.
  py::tuple quantize_add_rms_norm(py::array h, py::array branch, py::array weight, float eps) {
    check_array<float>(h, "h");
    check_array<float>(branch, "branch");
    check_array<float>(weight, "weight");
    if (h.ndim() != 2 || branch.ndim() != 2 || h.shape(0) != branch.shape(0) || h.shape(1) != branch.shape(1) ||
        weight.size() != h.shape(1))
      throw py::value_error("h, branch: [m, k] each, weight [k]");
    const int64_t m = h.shape(0), k = h.shape(1);
    if (k % 128 != 0 || k > 16384) throw py::value_error("the fused norm takes k % 128 == 0, k <= 16384");
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    const size_t bytes = h.nbytes();
    Buffer hf(bytes), hp(bytes), bd(bytes), wd(weight.nbytes()), yf(bytes), yp(bytes), yb(bytes / 2);
    for (Buffer* hb : {&hf, &hp})
      NINFER_CUDA_CHECK(cudaMemcpyAsync(hb->as<void>(), h.data(), bytes, cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(bd.as<void>(), branch.data(), bytes, cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(wd.as<void>(), weight.data(), weight.nbytes(), cudaMemcpyHostToDevice, stream_));
    for (Buffer* yb : {&yf, &yp}) NINFER_CUDA_CHECK(cudaMemsetAsync(yb->as<void>(), 0xff, bytes, stream_));  // NaN
    cuda::launch_add_rms_norm_to_fp8_activations(hf.as<float>(), bd.as<float>(), wd.as<float>(), eps, yf.as<float>(),
                                                 gemm_->activation_sink(m, k), yb.as<uint16_t>(), stream_);
    cuda::launch_add_rms_norm(hp.as<float>(), bd.as<float>(), m, k, wd.as<float>(), eps, yp.as<float>(), stream_,
                              false);
    py::tuple codes_scales = activations(m, k);
    auto fetch = [&](const Buffer& b) {
      py::array_t<float> a({m, k});
      NINFER_CUDA_CHECK(cudaMemcpyAsync(a.mutable_data(), b.as<void>(), bytes, cudaMemcpyDeviceToHost, stream_));
      return a;
    };
    py::array_t<float> h_fused = fetch(hf), y_fused = fetch(yf), h_plain = fetch(hp), y_plain = fetch(yp);
    py::array_t<uint16_t> y_bf16({m, k});
    NINFER_CUDA_CHECK(cudaMemcpyAsync(y_bf16.mutable_data(), yb.as<void>(), bytes / 2, cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return py::make_tuple(codes_scales[0], codes_scales[1], h_fused, y_fused, y_bf16, h_plain, y_plain);
  }

  // y [m, rows] = x · W^T (+ bias) through the FP8 GEMM (W8A8), W the stored tensor `blob`;
  // raises when the path refuses the shape. The output starts as NaN with guard bytes after.
  py::array_t<float> matmul(py::array x, const std::string& dtype, py::array blob, int64_t rows,
                            std::optional<py::array> bias) {
    check_array<float>(x, "x");
    check_array<uint8_t>(blob, "blob");
    const DType t = dtype_of(dtype);
    const int64_t m = x.shape(0), k = x.shape(1);
    if (static_cast<int64_t>(blob.nbytes()) != QuantizedLayout::of(t, rows, k, rows).nbytes)
      throw py::value_error("blob does not match [rows, k]");
    const Weight probe{t, rows, k};
    if (!cuda::Fp8BlockGemm::accepts(probe, m, true))
      throw py::value_error("the FP8 GEMM does not take this shape (m >= 16, k % 128 == 0, rows % 4 == 0)");
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    Buffer xd(x.nbytes()), wd(blob.nbytes()), yd(static_cast<size_t>(m * rows) * 4 + kGuard);
    NINFER_CUDA_CHECK(cudaMemcpyAsync(xd.as<void>(), x.data(), x.nbytes(), cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(wd.as<void>(), blob.data(), blob.nbytes(), cudaMemcpyHostToDevice, stream_));
    std::vector<float> nan(static_cast<size_t>(m * rows), std::numeric_limits<float>::quiet_NaN());
    NINFER_CUDA_CHECK(cudaMemcpyAsync(yd.as<void>(), nan.data(), nan.size() * 4, cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaMemsetAsync(yd.as<char>() + nan.size() * 4, kGuardByte, kGuard, stream_));
    std::unique_ptr<Buffer> bd;
    if (bias) {
      check_array<float>(*bias, "bias");
      if (bias->size() != rows) throw py::value_error("bias: [rows]");
      bd = std::make_unique<Buffer>(bias->nbytes());
      NINFER_CUDA_CHECK(cudaMemcpyAsync(bd->as<void>(), bias->data(), bias->nbytes(), cudaMemcpyHostToDevice, stream_));
    }
    const Weight w = quantized_weight_at(t, rows, k, rows, wd.as<void>());
    gemm_->quantize_activations(xd.as<float>(), m, k);
    const bool ran = gemm_->matmul(w, yd.as<float>());
    if (ran && bd) cuda::launch_add_bias(yd.as<float>(), bd->as<float>(), m, rows, stream_);
    py::array_t<float> y({m, rows});
    std::vector<unsigned char> guard(kGuard);
    NINFER_CUDA_CHECK(
        cudaMemcpyAsync(y.mutable_data(), yd.as<void>(), nan.size() * 4, cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(guard.data(), yd.as<char>() + nan.size() * 4, kGuard, cudaMemcpyDeviceToHost,
                                      stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    gemm_->forget_weights();
    if (!ran) throw std::runtime_error("the FP8 GEMM refused: " + gemm_->refusal());
    for (const unsigned char b : guard)
      if (b != kGuardByte) throw std::runtime_error("matmul wrote past its output");
    return y;
  }

  // cuBLASLt's block-scaled GEMM on operands given as they are (the scale-layout probe,
  // tools/gpu/fp8_scale_probe.py): w codes [n, k] under `w_scales` (BLK128x128), x codes [m, k]
  // under `x_scales` (VEC128), each scale buffer passed flat with `pad` floats of `pad_value`
  // after it (what cuBLASLt reads past the documented size shows). Returns (D as cuBLASLt wrote
  // it, row-major: [m, n], or [n, m] with x_first; "" or why the shape was refused).
  py::tuple raw_gemm(py::array w_codes, py::array w_scales, py::array x_codes, py::array x_scales, bool x_first,
                     bool bf16_out, int64_t pad, float pad_value) {
    check_array<uint8_t>(w_codes, "w_codes");
    check_array<uint8_t>(x_codes, "x_codes");
    check_array<float>(w_scales, "w_scales");
    check_array<float>(x_scales, "x_scales");
    const int64_t n = w_codes.shape(0), k = w_codes.shape(1), m = x_codes.shape(0);
    if (x_codes.shape(1) != k) throw py::value_error("x_codes: [m, k] with w_codes' k");
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    const auto& lt = cuda::CublasLtRuntime::get();
    if (!raw_handle_) raw_handle_ = lt.create_handle();
    const size_t ws_bytes = size_t(32) << 20;
    Buffer ws(ws_bytes), wd(w_codes.nbytes()), xd(x_codes.nbytes()), y(static_cast<size_t>(m * n) * 4);
    auto padded = [&](const py::array& a) {
      std::vector<float> v(static_cast<size_t>(a.size() + pad), pad_value);
      std::copy_n(static_cast<const float*>(a.data()), a.size(), v.begin());
      auto b = std::make_unique<Buffer>(v.size() * 4);
      NINFER_CUDA_CHECK(cudaMemcpy(b->as<void>(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
      return b;
    };
    const auto ws_d = padded(w_scales), xs_d = padded(x_scales);
    NINFER_CUDA_CHECK(cudaMemcpy(wd.as<void>(), w_codes.data(), w_codes.nbytes(), cudaMemcpyHostToDevice));
    NINFER_CUDA_CHECK(cudaMemcpy(xd.as<void>(), x_codes.data(), x_codes.nbytes(), cudaMemcpyHostToDevice));
    NINFER_CUDA_CHECK(cudaMemset(y.as<void>(), 0xff, static_cast<size_t>(m * n) * 4));  // NaN
    cuda::LtFp8Plan plan;
    const std::string why = lt.plan_fp8_block(raw_handle_, m, n, k, bf16_out ? CUDA_R_16BF : CUDA_R_32F, x_first,
                                              ws_bytes, 256, ws.as<void>(), plan);
    const int64_t rows = x_first ? n : m, cols = x_first ? m : n;
    py::array_t<float> out({rows, cols});
    if (!why.empty()) return py::make_tuple(out, why);
    lt.run_fp8_block(raw_handle_, plan, wd.as<void>(), ws_d->as<float>(), xd.as<void>(), xs_d->as<float>(),
                     y.as<void>(), ws.as<void>(), ws_bytes, stream_);
    if (bf16_out) {
      Buffer f(static_cast<size_t>(m * n) * 4);
      cuda::launch_bf16_to_f32(y.as<uint16_t>(), f.as<float>(), m * n, stream_);
      NINFER_CUDA_CHECK(cudaMemcpyAsync(out.mutable_data(), f.as<void>(), static_cast<size_t>(m * n) * 4,
                                        cudaMemcpyDeviceToHost, stream_));
      NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } else {
      NINFER_CUDA_CHECK(cudaMemcpyAsync(out.mutable_data(), y.as<void>(), static_cast<size_t>(m * n) * 4,
                                        cudaMemcpyDeviceToHost, stream_));
      NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    lt.destroy_plan(plan);
    return py::make_tuple(out, std::string());
  }

  // The FP8 form of an NVFP4 tensor as the prefill path makes it: (codes uint8 [rows, k],
  // scales f32 [ceil(rows / 128), k / 128]).
  py::tuple requantize(py::array blob, int64_t rows, int64_t k) {
    check_array<uint8_t>(blob, "blob");
    if (static_cast<int64_t>(blob.nbytes()) != QuantizedLayout::of(DType::NVFP4, rows, k, rows).nbytes)
      throw py::value_error("blob does not match [rows, k]");
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    Buffer wd(blob.nbytes());
    NINFER_CUDA_CHECK(cudaMemcpyAsync(wd.as<void>(), blob.data(), blob.nbytes(), cudaMemcpyHostToDevice, stream_));
    const auto [codes_d, scales_d] = gemm_->requantize(quantized_weight_at(DType::NVFP4, rows, k, rows, wd.as<void>()));
    const int64_t nb = (rows + 127) / 128, cb = k / 128, ld = (cb + 3) / 4 * 4;
    py::array_t<uint8_t> codes({rows, k});
    py::array_t<float> scales({nb, cb});
    NINFER_CUDA_CHECK(cudaMemcpyAsync(codes.mutable_data(), codes_d, static_cast<size_t>(rows * k),
                                      cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaMemcpy2DAsync(scales.mutable_data(), static_cast<size_t>(cb) * 4, scales_d,
                                        static_cast<size_t>(ld) * 4, static_cast<size_t>(cb) * 4,
                                        static_cast<size_t>(nb), cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return py::make_tuple(codes, scales);
  }

  // Device times (ms, one per rep) of one [m, k] × [rows, k]^T matmul by `path`: "fp8" (quantize
  // x + FP8 GEMM), "fp8-gemm" (the GEMM alone), "quantize", "nvfp4-fp8" (re-quantize the
  // NVFP4 weight + quantize x + FP8 GEMM), "fp8-bf16" / "nvfp4-bf16" (today's fallback:
  // dequantize to bf16, x to bf16, bf16 cuBLAS), "bf16" (the bf16 cuBLAS GEMM alone).
  std::vector<double> time(const std::string& path, int64_t rows, int64_t k, int64_t m, int reps) {
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    const bool nvfp4 = path.rfind("nvfp4", 0) == 0;
    const DType t = nvfp4 ? DType::NVFP4 : DType::FP8;
    const QuantizedLayout l = QuantizedLayout::of(t, rows, k, rows);
    Buffer wq(static_cast<size_t>(l.nbytes)), wb(static_cast<size_t>(rows * k) * 2), x(static_cast<size_t>(m * k) * 4),
        xb(static_cast<size_t>(m * k) * 2), y(static_cast<size_t>(m * rows) * 4);
    cuda::launch_random_quantized(nvfp4, wq.as<uint8_t>(), rows, k, rows, 11, 0.05f, stream_);
    cuda::launch_random_bf16(wb.as<uint16_t>(), rows * k, 12, 0.05f, stream_);
    cuda::launch_random_bf16(x.as<uint16_t>(), 2 * m * k, 13, 1.0f, stream_);  // bf16 pairs read as f32: finite
    const Weight w = quantized_weight_at(t, rows, k, rows, wq.as<void>());
    if (path.find("bf16") != std::string::npos && !cublas_) cublas_ = cuda::CublasRuntime::get().create_handle(stream_);
    const cuda::QuantGemvJob job{wq.as<uint8_t>(), w.scales, w.scale2, nullptr, nullptr, static_cast<int32_t>(rows),
                                 static_cast<int32_t>(rows), 0};
    auto bf16_gemm = [&] {
      cuda::CublasRuntime::get().gemm_bf16_rowmajor(cublas_, xb.as<uint16_t>(), wb.as<uint16_t>(), y.as<float>(),
                                                    static_cast<int>(m), static_cast<int>(rows), static_cast<int>(k));
    };
    std::function<void()> run;
    if (path == "fp8" || path == "nvfp4-fp8")
      run = [&] {
        gemm_->quantize_activations(x.as<float>(), m, k);
        if (!gemm_->matmul(w, y.as<float>())) throw std::runtime_error("the FP8 GEMM refused: " + gemm_->refusal());
      };
    else if (path == "fp8-gemm") {
      gemm_->quantize_activations(x.as<float>(), m, k);
      run = [&] {
        if (!gemm_->matmul(w, y.as<float>())) throw std::runtime_error("the FP8 GEMM refused: " + gemm_->refusal());
      };
    } else if (path == "quantize")
      run = [&] { gemm_->quantize_activations(x.as<float>(), m, k); };
    else if (path == "fp8-bf16" || path == "nvfp4-bf16")
      run = [&] {
        cuda::launch_dequantize_bf16(nvfp4, job, static_cast<int>(k), wb.as<uint16_t>(), stream_);
        cuda::launch_f32_to_bf16(x.as<float>(), xb.as<uint16_t>(), m * k, stream_);
        bf16_gemm();
      };
    else if (path == "bf16") {
      cuda::launch_f32_to_bf16(x.as<float>(), xb.as<uint16_t>(), m * k, stream_);
      run = bf16_gemm;
    } else
      throw py::value_error("unknown path '" + path + "'");
    for (int i = 0; i < 2; ++i) run();
    std::vector<cudaEvent_t> events(static_cast<size_t>(2 * reps));
    for (auto& e : events) NINFER_CUDA_CHECK(cudaEventCreate(&e));
    for (int i = 0; i < reps; ++i) {
      NINFER_CUDA_CHECK(cudaEventRecord(events[2 * i], stream_));
      run();
      NINFER_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream_));
    }
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      float v = 0.0f;
      NINFER_CUDA_CHECK(cudaEventElapsedTime(&v, events[2 * i], events[2 * i + 1]));
      ms.push_back(v);
    }
    for (auto& e : events) cudaEventDestroy(e);
    gemm_->forget_weights();
    return ms;
  }

 private:
  // The last activations of the GEMM: (codes [m, k], scales [m, k / 128]), both of their scale
  // layouts (the token-major main one, the last 16 rows' own) read back as [m, groups].
  py::tuple activations(int64_t m, int64_t k) {
    const int64_t groups = k / 128, main = m & ~int64_t(3);
    py::array_t<uint8_t> codes({m, k});
    std::vector<float> main_scales(static_cast<size_t>(groups * main)), tail(static_cast<size_t>(groups * 16));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(codes.mutable_data(), gemm_->activation_codes(), static_cast<size_t>(m * k),
                                      cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(main_scales.data(), gemm_->activation_scales(), main_scales.size() * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    if (main != m)
      NINFER_CUDA_CHECK(cudaMemcpyAsync(tail.data(), gemm_->tail_activation_scales(), tail.size() * 4,
                                        cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    py::array_t<float> scales({m, groups});
    auto s = scales.mutable_unchecked<2>();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t g = 0; g < groups; ++g)
        s(r, g) = r < main ? main_scales[static_cast<size_t>(g * main + r)]
                           : tail[static_cast<size_t>(g * 16 + r - (m - 16))];
    return py::make_tuple(codes, scales);
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;
  void* raw_handle_ = nullptr;
  std::unique_ptr<cuda::Fp8BlockGemm> gemm_;
};

}  // namespace
#endif

void bind_cuda_fp8_gemm(py::module_& m) {
#ifdef NINFER_WITH_CUDA
  py::class_<CudaFp8Gemm>(m, "CudaFp8Gemm",
                          "The FP8 prefill GEMM (cuBLASLt block-scaled) on numpy arrays, and timings.")
      .def(py::init<int, bool>(), py::arg("device") = 0, py::arg("x_first") = false,
           "x_first: only the pairing with x as cuBLASLt's A (its output transposed back), for tests")
      .def("quantize", &CudaFp8Gemm::quantize, py::arg("x"))
      .def("quantize_gated_rmsnorm", &CudaFp8Gemm::quantize_gated_rmsnorm, py::arg("x"), py::arg("z"),
           py::arg("weight"), py::arg("eps"),
           "(codes, scales) of the GDN gated norm, quantized as the fused producer computes it")
      .def("quantize_add_rms_norm", &CudaFp8Gemm::quantize_add_rms_norm, py::arg("h"), py::arg("branch"),
           py::arg("weight"), py::arg("eps"),
           "(codes, scales, h, y, y in bf16) of the fused residual add + RMSNorm producer, then (h, y) of the "
           "plain kernel")
      .def("quantize_swiglu", &CudaFp8Gemm::quantize_swiglu, py::arg("gate"), py::arg("up"),
           "(codes, scales) of silu(gate) * up, quantized as the fused MLP producer computes it")
      .def("matmul", &CudaFp8Gemm::matmul, py::arg("x"), py::arg("dtype"), py::arg("blob"), py::arg("rows"),
           py::arg("bias") = py::none())
      .def("raw_gemm", &CudaFp8Gemm::raw_gemm, py::arg("w_codes"), py::arg("w_scales"), py::arg("x_codes"),
           py::arg("x_scales"), py::arg("x_first") = false, py::arg("bf16_out") = false, py::arg("pad") = 0,
           py::arg("pad_value") = 1.0f,
           "cuBLASLt's block-scaled GEMM on given codes and flat scale buffers (the scale-layout probe)")
      .def("requantize", &CudaFp8Gemm::requantize, py::arg("blob"), py::arg("rows"), py::arg("k"))
      .def("time", &CudaFp8Gemm::time, py::arg("path"), py::arg("rows"), py::arg("k"), py::arg("m"),
           py::arg("reps") = 10);
#else
  (void)m;
#endif
}

}  // namespace ninfer::bindings
