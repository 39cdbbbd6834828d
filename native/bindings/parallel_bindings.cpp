// The CPU collective group (parallel/collective.h) on numpy arrays, for tests: one thread per
// rank runs a sequence of collectives over its own buffer, as tensor-parallel ranks do.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bindings/bindings.h"
#include "parallel/collective.h"

namespace py = pybind11;

namespace ninfer::bindings {

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Rank r starts from inputs[r]; each op of `ops` ("all_reduce" in place, or "all_gather",
// which replaces the buffer by the gathered [size · n] one) runs on every rank in turn.
// Returns every rank's final buffer.
std::vector<FloatArray> run_cpu_collectives(const std::vector<FloatArray>& inputs, const std::vector<std::string>& ops) {
  const int size = static_cast<int>(inputs.size());
  if (size < 1) throw py::value_error("at least one rank");
  std::vector<std::vector<float>> buffers;
  for (const auto& a : inputs) {
    if (a.ndim() != 1 || a.size() != inputs[0].size()) throw py::value_error("every rank needs a 1-D array of one size");
    buffers.emplace_back(a.data(), a.data() + a.size());
  }
  for (const auto& op : ops)
    if (op != "all_reduce" && op != "all_gather") throw py::value_error("unknown collective '" + op + "'");
  {
    py::gil_scoped_release release;
    auto group = make_cpu_collective_group(size);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r)
      threads.emplace_back([&, r] {
        try {
          Collective& c = *group[static_cast<size_t>(r)];
          auto& buffer = buffers[static_cast<size_t>(r)];
          for (const auto& op : ops) {
            const auto n = static_cast<int64_t>(buffer.size());
            if (op == "all_reduce") {
              c.all_reduce_sum(buffer.data(), n);
            } else {
              std::vector<float> out(static_cast<size_t>(n * size));
              c.all_gather(buffer.data(), n, out.data());
              buffer = std::move(out);
            }
          }
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  std::vector<FloatArray> out;
  for (const auto& b : buffers) {
    FloatArray a(static_cast<py::ssize_t>(b.size()));
    std::copy(b.begin(), b.end(), a.mutable_data());
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

void bind_parallel(py::module_& m) {
  m.def("run_cpu_collectives", &run_cpu_collectives, py::arg("inputs"), py::arg("ops"),
        "Runs `ops` (\"all_reduce\" | \"all_gather\") on a CPU collective group of len(inputs) "
        "ranks, rank r starting from inputs[r]; returns every rank's final buffer (tests).");
}

}  // namespace ninfer::bindings
