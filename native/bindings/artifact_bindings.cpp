// Python view of the artifact reader: header, tensor table, zero-copy numpy tensors, resources.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "artifact/artifact.h"
#include "bindings/bindings.h"

namespace py = pybind11;

namespace ninfer::bindings {

namespace {

// numpy has no bf16: bf16 is handed out as its uint16 bit patterns, q8_0 as the raw block bytes.
py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return py::dtype::of<float>();
    case DType::F16: return py::dtype("float16");
    case DType::BF16: return py::dtype::of<uint16_t>();
    case DType::Q8_0: case DType::FP8: case DType::NVFP4: return py::dtype::of<uint8_t>();
    case DType::I32: return py::dtype::of<int32_t>();
  }
  throw std::logic_error("unhandled dtype");
}

std::vector<int64_t> numpy_shape(const TensorView& view) {
  std::vector<int64_t> shape = view.shape;
  if (view.dtype == DType::Q8_0) shape.back() = row_bytes(DType::Q8_0, shape.back());
  if (is_block_quantized(view.dtype)) return {static_cast<int64_t>(view.nbytes)};  // codes, then scales
  return shape;
}

// A read-only array over the mapping whose base object keeps the Artifact (and the map) alive.
py::array tensor_array(const py::object& owner, const TensorView& view) {
  py::array array(numpy_dtype(view.dtype), numpy_shape(view), {}, view.data, owner);
  py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return array;
}

py::dict tensor_info(const TensorView& view) {
  py::dict info;
  info["dtype"] = std::string(dtype_name(view.dtype));
  info["shape"] = view.shape;
  info["nbytes"] = view.nbytes;
  return info;
}

}  // namespace

void bind_artifact(py::module_& m) {
  py::register_exception<ArtifactError>(m, "ArtifactError", PyExc_ValueError);

  py::class_<Artifact, std::shared_ptr<Artifact>>(m, "Artifact")
      .def_static(
          "open",
          [](const std::string& path) {
            std::unique_ptr<Artifact> artifact;
            {
              py::gil_scoped_release release;
              artifact = Artifact::open(path);
            }
            return std::shared_ptr<Artifact>(std::move(artifact));
          },
          py::arg("path"), "Map a .ninfer file; raises ArtifactError when it cannot be used.")
      .def_property_readonly("path", &Artifact::path)
      .def_property_readonly("file_size", &Artifact::file_size)
      .def_property_readonly("architecture", &Artifact::architecture)
      .def_property_readonly("header_json",
                             [](const Artifact& a) { return std::string(a.header_json()); })
      .def("tensor_names",
           [](const Artifact& a) {
             std::vector<std::string> names;
             names.reserve(a.tensors().size());
             for (const auto& view : a.tensors()) names.push_back(view.name);
             return names;
           })
      .def("has_tensor", [](const Artifact& a, const std::string& name) {
        return a.find(name) != nullptr;
      })
      .def(
          "tensor_info",
          [](const Artifact& a, const std::string& name) { return tensor_info(a.tensor(name)); },
          py::arg("name"), "{dtype, shape, nbytes} of one tensor.")
      .def(
          "tensor",
          [](py::object self, const std::string& name) {
            return tensor_array(self, self.cast<const Artifact&>().tensor(name));
          },
          py::arg("name"),
          "Zero-copy read-only numpy view (bf16 as uint16 bits, q8_0 as raw block bytes).")
      .def("resource_names", &Artifact::resource_names)
      .def("has_resource", [](const Artifact& a, const std::string& name) {
        return a.has_resource(name);
      })
      .def(
          "resource",
          [](const Artifact& a, const std::string& name) {
            std::string_view bytes = a.resource(name);
            return py::bytes(bytes.data(), bytes.size());
          },
          py::arg("name"), "A stored resource, byte for byte.");
}

}  // namespace ninfer::bindings
