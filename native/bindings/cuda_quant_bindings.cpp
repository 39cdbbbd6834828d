// The FP8/NVFP4 weight kernels on numpy arrays (tests: tests/test_cuda_quant_gemv.py) and
// device-timed at real shapes against a read of the same bytes (bench/bench_cuda_quant.py).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "common/dtype.h"

#ifdef NINFER_WITH_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers.h"
#include "backends/cuda/launchers_quant.h"
#endif

namespace py = pybind11;

namespace ninfer::bindings {

#ifdef NINFER_WITH_CUDA
namespace {

class Device {
 public:
  Device(size_t bytes, cudaStream_t stream) : stream_(stream) { NINFER_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 16))); }
  ~Device() {
    cudaStreamSynchronize(stream_);
    cudaFree(p_);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

bool is_nvfp4(const std::string& dtype) {
  if (dtype != "fp8" && dtype != "nvfp4") throw py::value_error("dtype must be 'fp8' or 'nvfp4'");
  return dtype == "nvfp4";
}

template <typename T>
std::unique_ptr<Device> upload(const py::array& a, const char* what, cudaStream_t stream) {
  if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style))
    throw py::type_error(std::string(what) + ": expected a C-contiguous " + std::string(py::str(py::dtype::of<T>())) +
                         " array");
  auto d = std::make_unique<Device>(a.nbytes(), stream);
  NINFER_CUDA_CHECK(cudaMemcpyAsync(d->as<void>(), a.data(), a.nbytes(), cudaMemcpyHostToDevice, stream));
  return d;
}

constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xa5;

class CudaQuantGemv {
 public:
  explicit CudaQuantGemv(int device) : device_(device) {
    NINFER_CUDA_CHECK(cudaSetDevice(device));
    NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaQuantGemv() {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  CudaQuantGemv(const CudaQuantGemv&) = delete;
  CudaQuantGemv& operator=(const CudaQuantGemv&) = delete;

  // outs[j] (+)= x · W_j^T (+ bias_j), W_j = rows [first_j, first_j + rows_j) of the stored
  // tensor blobs[j] (uint8, ninfer layout) of total_rows_j rows in matrices of group_rows_j.
  void gemv(py::array x, const std::string& dtype, const std::vector<py::array>& blobs,
            const std::vector<std::vector<int64_t>>& geometry, const std::vector<py::array>& outs,
            const std::vector<std::optional<py::array>>& biases, bool accumulate, int variant, bool overlap) {
    const bool nvfp4 = is_nvfp4(dtype);
    if (x.ndim() != 2 || blobs.empty() || blobs.size() != outs.size() || geometry.size() != outs.size() ||
        biases.size() != outs.size())
      throw py::value_error("gemv: x [m, k], and per weight a blob, geometry, out and bias (or None)");
    const int m = static_cast<int>(x.shape(0)), k = static_cast<int>(x.shape(1));
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    auto xd = upload<float>(x, "x", stream_);
    std::vector<std::unique_ptr<Device>> keep, ys;
    std::vector<cuda::QuantGemvJob> jobs;
    for (size_t j = 0; j < blobs.size(); ++j) {
      if (geometry[j].size() != 4) throw py::value_error("geometry: (total_rows, group_rows, first, rows)");
      const int64_t total = geometry[j][0], group = geometry[j][1], first = geometry[j][2], rows = geometry[j][3];
      const QuantizedLayout l = QuantizedLayout::of(nvfp4 ? DType::NVFP4 : DType::FP8, total, k, group);
      if (blobs[j].nbytes() != l.nbytes || first < 0 || rows < 1 || first + rows > total)
        throw py::value_error("gemv: a blob does not match its geometry");
      keep.push_back(upload<uint8_t>(blobs[j], "blob", stream_));
      const uint8_t* base = keep.back()->as<uint8_t>();
      const float* b = nullptr;
      if (biases[j]) {
        keep.push_back(upload<float>(*biases[j], "bias", stream_));
        b = keep.back()->as<float>();
      }
      const py::array& out = outs[j];
      if (!out.dtype().is(py::dtype::of<float>()) || out.nbytes() != static_cast<py::ssize_t>(m * rows * 4))
        throw py::value_error("out: float32 [m, rows]");
      auto y = std::make_unique<Device>(out.nbytes() + kGuard, stream_);
      NINFER_CUDA_CHECK(cudaMemsetAsync(y->as<char>() + out.nbytes(), kGuardByte, kGuard, stream_));
      NINFER_CUDA_CHECK(cudaMemcpyAsync(y->as<void>(), out.data(), out.nbytes(), cudaMemcpyHostToDevice, stream_));
      ys.push_back(std::move(y));
      jobs.push_back({base + first * row_bytes(nvfp4 ? DType::NVFP4 : DType::FP8, k), base + l.scale_offset,
                      nvfp4 ? reinterpret_cast<const float*>(base + l.scale2_offset) : nullptr, b,
                      ys.back()->as<float>(), static_cast<int32_t>(rows), static_cast<int32_t>(group),
                      static_cast<int32_t>(first)});
    }
    cuda::launch_gemv_quant_variant(variant, nvfp4, jobs.data(), static_cast<int>(jobs.size()), xd->as<float>(), m, k,
                                    accumulate, overlap, stream_);
    std::vector<unsigned char> guard(kGuard);
    for (size_t j = 0; j < outs.size(); ++j) {
      py::array out = outs[j];
      NINFER_CUDA_CHECK(cudaMemcpyAsync(out.mutable_data(), ys[j]->as<void>(), out.nbytes(), cudaMemcpyDeviceToHost, stream_));
      NINFER_CUDA_CHECK(cudaMemcpyAsync(guard.data(), ys[j]->as<char>() + out.nbytes(), kGuard, cudaMemcpyDeviceToHost,
                                        stream_));
      NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (const unsigned char c : guard)
        if (c != kGuardByte) throw std::runtime_error("gemv: a write landed past the end of an output");
    }
  }

  // bf16 bits [rows, k] of rows [first, first + rows) of a stored tensor, by the device kernel.
  py::array_t<uint16_t> dequantize(const std::string& dtype, py::array blob, int64_t total_rows, int64_t k,
                                   int64_t group_rows, int64_t first, int64_t rows) {
    const bool nvfp4 = is_nvfp4(dtype);
    const QuantizedLayout l = QuantizedLayout::of(nvfp4 ? DType::NVFP4 : DType::FP8, total_rows, k, group_rows);
    if (static_cast<int64_t>(blob.nbytes()) != l.nbytes || first < 0 || rows < 1 || first + rows > total_rows || k % 8)
      throw py::value_error("dequantize: the blob does not match its geometry");
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    auto d = upload<uint8_t>(blob, "blob", stream_);
    Device out(static_cast<size_t>(rows * k) * 2, stream_);
    const uint8_t* base = d->as<uint8_t>();
    const cuda::QuantGemvJob job{base + first * row_bytes(nvfp4 ? DType::NVFP4 : DType::FP8, k), base + l.scale_offset,
                                 nvfp4 ? reinterpret_cast<const float*>(base + l.scale2_offset) : nullptr, nullptr,
                                 nullptr, static_cast<int32_t>(rows), static_cast<int32_t>(group_rows),
                                 static_cast<int32_t>(first)};
    cuda::launch_dequantize_bf16(nvfp4, job, static_cast<int>(k), out.as<uint16_t>(), stream_);
    py::array_t<uint16_t> host({rows, k});
    NINFER_CUDA_CHECK(cudaMemcpyAsync(host.mutable_data(), out.as<void>(), host.nbytes(), cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host;
  }

  // The stored bytes of a device-made random tensor (launch_random_quantized).
  py::array_t<uint8_t> random(const std::string& dtype, int64_t rows, int64_t k, int64_t group_rows, uint64_t seed,
                              float scale) {
    const bool nvfp4 = is_nvfp4(dtype);
    const QuantizedLayout l = QuantizedLayout::of(nvfp4 ? DType::NVFP4 : DType::FP8, rows, k, group_rows);
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    Device d(static_cast<size_t>(l.nbytes), stream_);
    NINFER_CUDA_CHECK(cudaMemsetAsync(d.as<void>(), 0, static_cast<size_t>(l.nbytes), stream_));
    cuda::launch_random_quantized(nvfp4, d.as<uint8_t>(), rows, k, group_rows, seed, scale, stream_);
    py::array_t<uint8_t> host(l.nbytes);
    NINFER_CUDA_CHECK(cudaMemcpyAsync(host.mutable_data(), d.as<void>(), l.nbytes, cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host;
  }

  // Device ms of each of `reps` launches of one matmul_many-shaped quantized GEMV (weights of
  // `rows` rows each, width k) at batch m, cycling weight copies past the L2; and the bytes
  // one launch reads (codes and scales), for the caller's read-rate ratio.
  std::pair<std::vector<double>, int64_t> time_gemv(const std::string& dtype, const std::vector<int64_t>& rows, int64_t k,
                                                    int m, int variant, int reps) {
    const bool nvfp4 = is_nvfp4(dtype);
    const DType t = nvfp4 ? DType::NVFP4 : DType::FP8;
    NINFER_CUDA_CHECK(cudaSetDevice(device_));
    int64_t set_bytes = 0;
    std::vector<QuantizedLayout> layouts;
    for (const int64_t r : rows) {
      layouts.push_back(QuantizedLayout::of(t, r, k, r));
      set_bytes += (layouts.back().nbytes + 255) / 256 * 256;
    }
    const int64_t copies = std::clamp<int64_t>((int64_t(1) << 30) / set_bytes + 1, 1, 16);
    Device w(static_cast<size_t>(copies * set_bytes), stream_), x(static_cast<size_t>(m * k) * 4, stream_);
    int64_t out_elems = 0;
    for (const int64_t r : rows) out_elems += r * m;
    Device y(static_cast<size_t>(out_elems) * 4, stream_);
    cuda::launch_random_bf16(x.as<uint16_t>(), 2 * m * k, 2, 1.0f, stream_);  // bf16 pairs read as f32: finite
    std::vector<std::vector<cuda::QuantGemvJob>> sets(static_cast<size_t>(copies));
    for (int64_t c = 0; c < copies; ++c) {
      uint8_t* base = w.as<uint8_t>() + c * set_bytes;
      float* out = y.as<float>();
      for (size_t j = 0; j < rows.size(); ++j) {
        cuda::launch_random_quantized(nvfp4, base, rows[j], k, rows[j], 7 + c * 31 + j, 0.05f, stream_);
        sets[c].push_back({base, base + layouts[j].scale_offset,
                           nvfp4 ? reinterpret_cast<const float*>(base + layouts[j].scale2_offset) : nullptr, nullptr,
                           out, static_cast<int32_t>(rows[j]), static_cast<int32_t>(rows[j]), 0});
        base += (layouts[j].nbytes + 255) / 256 * 256;
        out += rows[j] * m;
      }
    }
    int64_t bytes = 0;
    for (const auto& l : layouts) bytes += l.nbytes;
    auto run = [&](int64_t c) {
      cuda::launch_gemv_quant_variant(variant, nvfp4, sets[c].data(), static_cast<int>(sets[c].size()), x.as<float>(),
                                      m, static_cast<int>(k), false, false, stream_);
    };
    for (int i = 0; i < 3; ++i) run(i % copies);
    std::vector<cudaEvent_t> events(static_cast<size_t>(2 * reps));
    for (auto& e : events) NINFER_CUDA_CHECK(cudaEventCreate(&e));
    for (int i = 0; i < reps; ++i) {
      NINFER_CUDA_CHECK(cudaEventRecord(events[2 * i], stream_));
      run(i % copies);
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
    return {ms, bytes};
  }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace
#endif

void bind_cuda_quant(py::module_& m) {
#ifdef NINFER_WITH_CUDA
  py::class_<CudaQuantGemv>(m, "CudaQuantGemv", "The FP8/NVFP4 weight kernels on numpy arrays, and their timings.")
      .def(py::init<int>(), py::arg("device") = 0)
      .def("gemv", &CudaQuantGemv::gemv, py::arg("x"), py::arg("dtype"), py::arg("blobs"), py::arg("geometry"),
           py::arg("outs"), py::arg("biases"), py::arg("accumulate") = false, py::arg("variant") = 0,
           py::arg("overlap") = false)
      .def("dequantize", &CudaQuantGemv::dequantize, py::arg("dtype"), py::arg("blob"), py::arg("total_rows"),
           py::arg("k"), py::arg("group_rows"), py::arg("first"), py::arg("rows"))
      .def("random", &CudaQuantGemv::random, py::arg("dtype"), py::arg("rows"), py::arg("k"), py::arg("group_rows"),
           py::arg("seed"), py::arg("scale"))
      .def("time_gemv", &CudaQuantGemv::time_gemv, py::arg("dtype"), py::arg("rows"), py::arg("k"), py::arg("m"),
           py::arg("variant"), py::arg("reps"));
#else
  (void)m;
#endif
}

}  // namespace ninfer::bindings
