// _core.CudaSampler: the CUDA backend's sample_rows on numpy logits (tests, benchmarks), and a
// timing of it against today's host path (copy the logits out, sample on the host).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bindings/bindings.h"
#include "engine/sampler.h"

#ifdef NINFER_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace py = pybind11;

namespace ninfer::bindings {

#ifdef NINFER_WITH_CUDA
namespace {

using Logits = py::array_t<float, py::array::c_style | py::array::forcecast>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

class CudaSampler {
 public:
  CudaSampler(int device, int cluster_blocks) : backend_(device) { backend_.set_sample_cluster_blocks(cluster_blocks); }

  py::array_t<int32_t> sample_rows(const Logits& logits, const py::list& rows) {
    const SamplingBatch batch = sampling_batch_from(rows);
    const int64_t vocab = check(logits, batch);
    Buffer device = backend_.alloc(logits.size());
    backend_.copy_from_host(device.data(), logits.data(), logits.size());
    py::array_t<int32_t> ids(static_cast<py::ssize_t>(batch.rows.size()));
    std::fill(ids.mutable_data(), ids.mutable_data() + ids.size(), 0x7eadbeef);  // poison
    int32_t* out = ids.mutable_data();
    py::gil_scoped_release release;
    backend_.sample_rows(device.data(), vocab, batch, out);
    return ids;
  }

  // Median milliseconds over `iters` calls of: device sampling (a fresh copy of the logits on
  // the device, then sample_rows), that device-side copy alone, and today's host path: copying
  // the logits to pageable host memory, then sampling every row on the host (sum over rows).
  py::dict time(const Logits& logits, const py::list& rows, int iters, bool host_path) {
    const SamplingBatch batch = sampling_batch_from(rows);
    const int64_t vocab = check(logits, batch);
    const int64_t n = logits.size();
    Buffer pristine = backend_.alloc(n), work = backend_.alloc(n);
    backend_.copy_from_host(pristine.data(), logits.data(), n);
    std::vector<int32_t> ids(batch.rows.size());
    std::vector<float> host(static_cast<size_t>(n));
    std::vector<double> device_ms, refresh_ms, copy_ms, host_ms;
    using Clock = std::chrono::steady_clock;
    const auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    {
      py::gil_scoped_release release;
      for (int i = 0; i < iters + 2; ++i) {  // two warm-up rounds
        const bool keep = i >= 2;
        auto t0 = Clock::now();
        backend_.copy(work.data(), pristine.data(), n);
        backend_.synchronize();
        auto t1 = Clock::now();
        backend_.copy(work.data(), pristine.data(), n);
        backend_.sample_rows(work.data(), vocab, batch, ids.data());
        auto t2 = Clock::now();
        if (!host_path) {
          if (keep) {
            refresh_ms.push_back(ms(t0, t1));
            device_ms.push_back(ms(t1, t2));
          }
          continue;
        }
        backend_.copy_to_host(host.data(), pristine.data(), n);
        auto t3 = Clock::now();
        for (size_t r = 0; r < batch.rows.size(); ++r)
          (void)sample_row_on_host(std::span(host).subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
                                   batch, r);
        auto t4 = Clock::now();
        if (!keep) continue;
        refresh_ms.push_back(ms(t0, t1));
        device_ms.push_back(ms(t1, t2));
        copy_ms.push_back(ms(t2, t3));
        host_ms.push_back(ms(t3, t4));
      }
    }
    py::dict d;
    d["device_ms"] = median(device_ms);
    d["refresh_ms"] = median(refresh_ms);
    d["copy_ms"] = median(copy_ms);
    d["host_sample_ms"] = median(host_ms);
    return d;
  }

 private:
  static int64_t check(const Logits& logits, const SamplingBatch& batch) {
    if (logits.ndim() != 2 || static_cast<size_t>(logits.shape(0)) != batch.rows.size() || logits.shape(1) < 1)
      throw py::value_error("logits must be [rows, vocab] with one row per sampling row");
    return logits.shape(1);
  }

  cuda::CudaBackend backend_;
};

}  // namespace

void bind_cuda_sampling(py::module_& m) {
  py::class_<CudaSampler>(m, "CudaSampler", "The CUDA backend's sample_rows on numpy logits (tests, benchmarks).")
      .def(py::init<int, int>(), py::arg("device") = 0, py::arg("cluster_blocks") = 0,
           "cluster_blocks: blocks per row (1, 2, 4, 8, 16; 0 = by vocabulary size).")
      .def("sample_rows", &CudaSampler::sample_rows, py::arg("logits"), py::arg("rows"),
           "ids chosen on the device (rows as for sample_rows_host).")
      .def("time", &CudaSampler::time, py::arg("logits"), py::arg("rows"), py::arg("iters") = 20,
           py::arg("host_path") = true,
           "Median ms: device_ms (sample_rows incl. a device-side logits refresh), refresh_ms (that refresh "
           "alone), copy_ms (logits to pageable host memory), host_sample_ms (host sampling, all rows; both 0 "
           "unless host_path).");
}
#else
void bind_cuda_sampling(py::module_&) {}
#endif

}  // namespace ninfer::bindings
