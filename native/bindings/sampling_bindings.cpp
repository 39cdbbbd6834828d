// Python view of sampling on the device: SamplingBatch from a list of row dicts, the host
// reference of a device sampler (tests compare the CUDA kernel with it), and the CUDA sampler
// itself where the build has one (cuda_sampling_bindings.cpp).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "engine/sampler.h"

namespace py = pybind11;

namespace ninfer::bindings {

namespace {

template <typename T>
T field(const py::dict& row, const char* name, T fallback) {
  return row.contains(name) ? row[name].cast<T>() : fallback;
}

}  // namespace

SamplingBatch sampling_batch_from(const py::list& rows) {
  SamplingBatch batch;
  for (const auto& item : rows) {
    const auto row = item.cast<py::dict>();
    for (const auto& [key, value] : row) {
      static const std::vector<std::string> known = {"temperature", "top_k", "top_p", "min_p", "presence_penalty",
                                                     "frequency_penalty", "uniform", "penalties", "suppressed",
                                                     "bitmask"};
      const auto name = key.cast<std::string>();
      if (std::find(known.begin(), known.end(), name) == known.end())
        throw py::value_error("unknown sampling row field '" + name + "'");
    }
    RowSampling r;
    r.temperature = field(row, "temperature", 1.0f);
    r.top_k = field(row, "top_k", 0);
    r.top_p = field(row, "top_p", 1.0f);
    r.min_p = field(row, "min_p", 0.0f);
    r.presence_penalty = field(row, "presence_penalty", 0.0f);
    r.frequency_penalty = field(row, "frequency_penalty", 0.0f);
    r.uniform = field(row, "uniform", 0.0);
    std::vector<int32_t> tokens, counts;
    for (const auto& [token, count] : field(row, "penalties", std::map<int32_t, int32_t>{})) {
      tokens.push_back(token);
      counts.push_back(count);
    }
    batch.add_row(r, tokens, counts, field(row, "suppressed", std::vector<int32_t>{}),
                  field(row, "bitmask", std::vector<uint32_t>{}));
  }
  batch.validate();
  return batch;
}

void bind_sampling(py::module_& m) {
  m.def(
      "sample_rows_host",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, const py::list& rows) {
        const SamplingBatch batch = sampling_batch_from(rows);
        if (logits.ndim() != 2 || static_cast<size_t>(logits.shape(0)) != batch.rows.size())
          throw py::value_error("logits must be [rows, vocab] with one row per sampling row");
        const auto vocab = static_cast<size_t>(logits.shape(1));
        std::vector<float> scratch(logits.data(), logits.data() + logits.size());
        py::array_t<int32_t> ids(static_cast<py::ssize_t>(batch.rows.size()));
        int32_t* out = ids.mutable_data();
        py::gil_scoped_release release;
        for (size_t r = 0; r < batch.rows.size(); ++r)
          out[r] = sample_row_on_host(std::span(scratch).subspan(r * vocab, vocab), batch, r);
        return ids;
      },
      py::arg("logits"), py::arg("rows"),
      "What a device sampler must return for each row (ids, or -1 for a NaN, -2 for no selectable token): the "
      "Sampler's choice with the row's draw. rows: dicts of temperature, top_k, top_p, min_p, presence_penalty, "
      "frequency_penalty, uniform, penalties {token: count}, suppressed [ids], bitmask [uint32 words of the "
      "allowed tokens].");
  bind_cuda_sampling(m);
}

}  // namespace ninfer::bindings
