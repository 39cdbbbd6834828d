// The hand GEMV's kernel variants on numpy arrays (tests) and device-timed at real shapes
// against cuBLAS, a read-only stream and a device copy (bench/bench_cuda_gemv.py).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bindings.h"

#ifdef NINFER_WITH_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cublas_runtime.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers.h"
#endif

namespace py = pybind11;

namespace ninfer::bindings {

#ifdef NINFER_WITH_CUDA
namespace {

// Device memory that frees itself (after the stream's work on it).
class DeviceBytes {
 public:
  DeviceBytes(size_t bytes, cudaStream_t stream) : stream_(stream) {
    NINFER_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)));
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() {
    cudaStreamSynchronize(stream_);
    cudaFree(ptr_);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

template <typename T>
std::unique_ptr<DeviceBytes> upload(const py::array& a, const char* what, cudaStream_t stream) {
  if (!a.dtype().is(py::dtype::of<T>()))
    throw py::type_error(std::string(what) + ": expected dtype " + std::string(py::str(py::dtype::of<T>())));
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(what) + ": must be C-contiguous");
  auto d = std::make_unique<DeviceBytes>(a.nbytes(), stream);
  NINFER_CUDA_CHECK(cudaMemcpyAsync(d->as<void>(), a.data(), a.nbytes(), cudaMemcpyHostToDevice, stream));
  return d;
}

constexpr int kCublasVariant = -2;  // time_gemv: the backend's cuBLAS path (x to bf16, then GEMMs)
constexpr size_t kGuardBytes = 256;      // checked past every output of gemv() for stray writes
constexpr unsigned char kGuardByte = 0xa5;

class CudaGemv {
 public:
  explicit CudaGemv(int device) : device_(device) {
    NINFER_CUDA_CHECK(cudaSetDevice(device));
    NINFER_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
    NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (cuda::CublasRuntime::get().available()) cublas_ = cuda::CublasRuntime::get().create_handle(stream_);
    const int64_t warps = cuda::gemv_workspace_blocks(num_sms_);
    workspace_memory_ = std::make_unique<DeviceBytes>(cuda::gemv_workspace_bytes(warps), stream_);
    NINFER_CUDA_CHECK(
        cudaMemsetAsync(workspace_memory_->as<void>(), 0, cuda::gemv_workspace_bytes(warps), stream_));
    workspace_ = cuda::gemv_workspace_at(workspace_memory_->as<void>(), warps);
  }
  ~CudaGemv() {
    cudaSetDevice(device_);
    workspace_memory_.reset();
    cudaStreamSynchronize(stream_);
    if (cublas_) cuda::CublasRuntime::get().destroy_handle(cublas_);
    cudaStreamDestroy(stream_);
  }
  CudaGemv(const CudaGemv&) = delete;
  CudaGemv& operator=(const CudaGemv&) = delete;

  std::vector<std::string> variants() const {
    std::vector<std::string> names;
    for (int v = 0; v < cuda::gemv_variant_count(); ++v) names.emplace_back(cuda::gemv_variant_name(v));
    return names;
  }

  // outs[j] = (accumulate ? outs[j] : 0) + x · weights[j]^T (+ biases[j]); weights are bf16 bits
  // (uint16 [rows_j, k]), x f32 [m, k]; every out is uploaded too (poison shows what was written).
  void gemv(py::array x, const std::vector<py::array>& weights, const std::vector<py::array>& outs,
            const std::vector<std::optional<py::array>>& biases, bool accumulate, int variant, bool overlap) {
    if (x.ndim() != 2 || weights.empty() || weights.size() != outs.size() || biases.size() != outs.size())
      throw py::value_error("gemv: x [m, k], and one weight, out and bias (or None) each");
    const int m = static_cast<int>(x.shape(0)), k = static_cast<int>(x.shape(1));
    auto xd = upload<float>(x, "x", stream_);
    std::vector<std::unique_ptr<DeviceBytes>> keep, ys;
    std::vector<cuda::GemvJob> jobs;
    for (size_t j = 0; j < weights.size(); ++j) {
      if (weights[j].ndim() != 2 || weights[j].shape(1) != k) throw py::value_error("gemv: weights must be [rows, k]");
      keep.push_back(upload<uint16_t>(weights[j], "weight", stream_));
      const auto* w = keep.back()->as<uint16_t>();
      const float* b = nullptr;
      if (biases[j]) {
        keep.push_back(upload<float>(*biases[j], "bias", stream_));
        b = keep.back()->as<float>();
      }
      ys.push_back(upload_with_guard(outs[j]));
      jobs.push_back({w, b, ys.back()->as<float>(), static_cast<int32_t>(weights[j].shape(0))});
    }
    cuda::launch_gemv_bf16(jobs.data(), static_cast<int>(jobs.size()), xd->as<float>(), m, k,
                           {.workspace = workspace_, .accumulate = accumulate, .overlap_previous = overlap,
                            .variant = variant},
                           stream_);
    std::vector<unsigned char> guard(kGuardBytes);
    for (size_t j = 0; j < outs.size(); ++j) {
      py::array out = outs[j];
      if (!out.writeable()) throw py::value_error("output array must be writable");
      NINFER_CUDA_CHECK(cudaMemcpyAsync(out.mutable_data(), ys[j]->as<void>(), out.nbytes(), cudaMemcpyDeviceToHost,
                                        stream_));
      NINFER_CUDA_CHECK(cudaMemcpyAsync(guard.data(), ys[j]->as<char>() + out.nbytes(), kGuardBytes,
                                        cudaMemcpyDeviceToHost, stream_));
      NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (const unsigned char b : guard)
        if (b != kGuardByte) throw std::runtime_error("gemv: a write landed past the end of an output");
    }
  }

  // A device copy of a float32 output followed by kGuardBytes of kGuardByte.
  std::unique_ptr<DeviceBytes> upload_with_guard(const py::array& out) {
    if (!out.dtype().is(py::dtype::of<float>()) || !(out.flags() & py::array::c_style))
      throw py::type_error("out: expected a C-contiguous float32 array");
    auto d = std::make_unique<DeviceBytes>(out.nbytes() + kGuardBytes, stream_);
    NINFER_CUDA_CHECK(cudaMemsetAsync(d->as<char>() + out.nbytes(), kGuardByte, kGuardBytes, stream_));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(d->as<void>(), out.data(), out.nbytes(), cudaMemcpyHostToDevice, stream_));
    return d;
  }

  // Device time (ms) of each of `reps` launches of one matmul_many-shaped GEMV (weights of
  // `rows` rows each, width k, random bf16) at batch m: a GEMV variant (-1: the launcher's
  // choice) or kCublasVariant. Enough weight copies are cycled that the weights come from
  // memory, not L2.
  std::vector<double> time_gemv(const std::vector<int64_t>& rows, int64_t k, int m, int variant, int reps) {
    if (variant == kCublasVariant && !cublas_) throw std::runtime_error("cuBLAS is not loadable");
    int64_t set_elems = 0;
    for (const int64_t r : rows) set_elems += r * k;
    const int64_t copies = std::clamp<int64_t>((int64_t(1) << 30) / (2 * set_elems) + 1, 1, 16);
    DeviceBytes w(static_cast<size_t>(copies * set_elems) * 2, stream_), x(static_cast<size_t>(m * k) * 4, stream_),
        xb(static_cast<size_t>(m * k) * 2, stream_);
    int64_t out_elems = 0;
    for (const int64_t r : rows) out_elems += r * m;
    DeviceBytes y(static_cast<size_t>(out_elems) * 4, stream_);
    cuda::launch_random_bf16(w.as<uint16_t>(), copies * set_elems, 1, 0.05f, stream_);
    cuda::launch_random_bf16(x.as<uint16_t>(), 2 * m * k, 2, 1.0f, stream_);  // bf16 pairs read as f32: finite
    auto run = [&](int64_t copy) {
      const uint16_t* base = w.as<uint16_t>() + copy * set_elems;
      float* out = y.as<float>();
      if (variant == kCublasVariant) {
        cuda::launch_f32_to_bf16(x.as<float>(), xb.as<uint16_t>(), m * k, stream_);
        for (const int64_t r : rows) {
          cuda::CublasRuntime::get().gemm_bf16_rowmajor(cublas_, xb.as<void>(), base, out, m, static_cast<int>(r),
                                                        static_cast<int>(k));
          base += r * k;
          out += r * m;
        }
        return;
      }
      std::vector<cuda::GemvJob> jobs;
      for (const int64_t r : rows) {
        jobs.push_back({base, nullptr, out, static_cast<int32_t>(r)});
        base += r * k;
        out += r * m;
      }
      cuda::launch_gemv_bf16(jobs.data(), static_cast<int>(jobs.size()), x.as<float>(), m, static_cast<int>(k),
                             {.workspace = workspace_, .variant = variant}, stream_);
    };
    return time_each(reps, copies, run);
  }

  // Device time (ms) of each of `reps` reads of `bytes` (cycling over copies past the L2).
  std::vector<double> time_read(int64_t bytes, int reps) {
    const int64_t copies = std::clamp<int64_t>((int64_t(1) << 30) / bytes + 1, 1, 16);
    DeviceBytes data(static_cast<size_t>(copies * bytes), stream_), sink(16, stream_);
    cuda::launch_random_bf16(data.as<uint16_t>(), copies * bytes / 2, 3, 1.0f, stream_);
    return time_each(reps, copies, [&](int64_t copy) {
      cuda::launch_read_stream(data.as<char>() + copy * bytes, bytes, sink.as<uint32_t>(), num_sms_, stream_);
    });
  }

  // Device time (ms) of each of `reps` device-to-device copies of `bytes`.
  std::vector<double> time_copy(int64_t bytes, int reps) {
    DeviceBytes a(static_cast<size_t>(bytes), stream_), b(static_cast<size_t>(bytes), stream_);
    return time_each(reps, 1, [&](int64_t) {
      NINFER_CUDA_CHECK(cudaMemcpyAsync(b.as<void>(), a.as<void>(), static_cast<size_t>(bytes),
                                        cudaMemcpyDeviceToDevice, stream_));
    });
  }

 private:
  template <typename Run>
  std::vector<double> time_each(int reps, int64_t copies, Run run) {
    for (int i = 0; i < 3; ++i) run(i % copies);  // warm-up
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
      float t = 0.0f;
      NINFER_CUDA_CHECK(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]));
      ms.push_back(t);
    }
    for (auto& e : events) cudaEventDestroy(e);
    return ms;
  }

  int device_ = 0;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;
  std::unique_ptr<DeviceBytes> workspace_memory_;
  cuda::GemvWorkspace workspace_;
};

}  // namespace
#endif

void bind_cuda_gemv(py::module_& m) {
#ifdef NINFER_WITH_CUDA
  py::class_<CudaGemv>(m, "CudaGemv", "The hand GEMV's variants on numpy arrays, and device timings of them.")
      .def(py::init<int>(), py::arg("device") = 0)
      .def_property_readonly_static("cublas_variant", [](py::object) { return kCublasVariant; })
      .def("variants", &CudaGemv::variants)
      .def("gemv", &CudaGemv::gemv, py::arg("x"), py::arg("weights"), py::arg("outs"), py::arg("biases"),
           py::arg("accumulate") = false, py::arg("variant") = -1, py::arg("overlap") = false)
      .def("time_gemv", &CudaGemv::time_gemv, py::arg("rows"), py::arg("k"), py::arg("m"), py::arg("variant"),
           py::arg("reps"))
      .def("time_read", &CudaGemv::time_read, py::arg("bytes"), py::arg("reps"))
      .def("time_copy", &CudaGemv::time_copy, py::arg("bytes"), py::arg("reps"));
#else
  (void)m;
#endif
}

}  // namespace ninfer::bindings
