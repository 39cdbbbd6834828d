// The MoE MLP of the CUDA backend on numpy arrays (tests/test_cuda_moe_decode.py): the fused
// decode kernels (Backend::moe_mlp_fused) and, for comparison, the separate ops the model runs
// otherwise (router matmul, moe_experts on a chosen path, the gated shared expert), over weights
// given in their stored bytes (bf16 bit patterns, or whole fp8/nvfp4 tensors as the artifact
// stores them).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "artifact/artifact.h"
#include "bindings/bindings.h"
#include "common/dtype.h"

#ifdef NINFER_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace py = pybind11;

namespace ninfer::bindings {

#ifdef NINFER_WITH_CUDA
namespace {

using cuda::CudaBackend;

CudaBackend::MoePath moe_path_named(const std::string& name) {
  if (name == "auto") return CudaBackend::MoePath::Auto;
  if (name == "gemv") return CudaBackend::MoePath::Gemv;
  if (name == "grouped") return CudaBackend::MoePath::Grouped;
  if (name == "host") return CudaBackend::MoePath::Host;
  throw py::value_error("moe path must be auto, gemv, grouped or host");
}

class CudaMoeDecode {
 public:
  explicit CudaMoeDecode(int device) : backend_(device) {}

  // Each weight is (stored bytes, dtype name, logical shape): a bf16 [N, K] as uint16 bits, an
  // fp8/nvfp4 tensor ([N, K] or a stack [E, N, K]) as its whole uint8 blob.
  // fused: Backend::moe_mlp_fused (returns whether it ran); else the separate ops with
  // moe_experts on `path`. out [tokens, hidden] float32 is uploaded first (poison it) and
  // downloaded after.
  bool moe_mlp(py::array x, const py::tuple& router, const py::tuple& gate_up, const py::tuple& down,
               const py::tuple& shared_gate, const py::tuple& gate, const py::tuple& up, const py::tuple& shared_down,
               int64_t top_k, bool renormalize, py::array out, bool fused, const std::string& path) {
    if (x.ndim() != 2 || out.ndim() != 2 || out.shape(0) != x.shape(0) || out.shape(1) != x.shape(1))
      throw py::value_error("moe_mlp: x and out [tokens, hidden]");
    const int64_t tokens = x.shape(0), hidden = x.shape(1);
    const Weight w_router = stored(router), w_gate_up = stored(gate_up), w_down = stored(down);
    const Weight w_shared_gate = stored(shared_gate), w_gate = stored(gate), w_up = stored(up),
                 w_shared_down = stored(shared_down);
    const auto down_shape = py::cast<std::vector<int64_t>>(down[2]);
    MoeExperts experts;
    experts.gate_up = w_gate_up;
    experts.down = w_down;
    experts.num_experts = w_router.rows;
    experts.ff = down_shape.back();
    experts.top_k = top_k;
    experts.renormalize = renormalize;
    const MoeMlp mlp{&w_router, &experts, &w_shared_gate, &w_gate, &w_up, &w_shared_down, w_gate.rows};
    Buffer xd = to_device(x), od = to_device(out);
    bool ran = false;
    backend_.set_moe_path(moe_path_named(path));
    if (fused) {
      ran = backend_.moe_mlp_fused(xd.data(), tokens, hidden, mlp, od.data());
    } else {
      const int64_t sff = w_gate.rows;
      Buffer logits = backend_.alloc(tokens * experts.num_experts), gate_logit = backend_.alloc(tokens);
      Buffer g = backend_.alloc(tokens * sff), u = backend_.alloc(tokens * sff), shared = backend_.alloc(tokens * hidden);
      backend_.matmul(xd.data(), tokens, w_router, nullptr, logits.data());
      backend_.moe_experts(xd.data(), tokens, hidden, logits.data(), experts, od.data());
      backend_.matmul(xd.data(), tokens, w_shared_gate, nullptr, gate_logit.data());
      const MatmulOutput gu[] = {{&w_gate, nullptr, g.data()}, {&w_up, nullptr, u.data()}};
      backend_.matmul_many(xd.data(), tokens, gu);
      backend_.swiglu(g.data(), u.data(), tokens * sff, g.data());
      backend_.matmul(g.data(), tokens, w_shared_down, nullptr, shared.data());
      backend_.add_sigmoid_gated(od.data(), shared.data(), gate_logit.data(), tokens, hidden);
      ran = true;
    }
    backend_.set_moe_path(CudaBackend::MoePath::Auto);
    backend_.synchronize();
    backend_.copy_to_host(static_cast<float*>(out.mutable_data()), od.data(), tokens * hidden);
    return ran;
  }

 private:
  Weight stored(const py::tuple& spec) {
    if (spec.size() != 3) throw py::value_error("a weight is (bytes, dtype, shape)");
    auto raw = py::cast<py::array>(spec[0]);
    if (!(raw.flags() & py::array::c_style)) throw py::value_error("weight bytes must be C-contiguous");
    const auto shape = py::cast<std::vector<int64_t>>(spec[2]);
    if (shape.size() < 2 || shape.size() > 3) throw py::value_error("a weight shape is [N, K] or [E, N, K]");
    TensorView view;
    view.name = "weight";
    view.dtype = dtype_from_name(py::cast<std::string>(spec[1]));
    view.shape = {shape.size() == 3 ? shape[0] * shape[1] : shape[0], shape.back()};
    view.group_rows = shape[shape.size() - 2];
    view.nbytes = static_cast<uint64_t>(raw.nbytes());
    view.data = raw.data();
    return backend_.upload_weight(view);
  }

  Buffer to_device(py::array& a) {
    if (!a.dtype().is(py::dtype::of<float>()) || !(a.flags() & py::array::c_style))
      throw py::type_error("x and out must be C-contiguous float32");
    Buffer b = backend_.alloc(a.size());
    backend_.copy_from_host(b.data(), static_cast<const float*>(a.data()), a.size());
    return b;
  }

  CudaBackend backend_;
};

}  // namespace
#endif

void bind_cuda_moe_decode(py::module_& m) {
#ifdef NINFER_WITH_CUDA
  py::class_<CudaMoeDecode>(m, "CudaMoeDecode", "The CUDA MoE MLP (fused decode kernels or separate ops) on numpy.")
      .def(py::init<int>(), py::arg("device") = 0)
      .def("moe_mlp", &CudaMoeDecode::moe_mlp, py::arg("x"), py::arg("router"), py::arg("gate_up"), py::arg("down"),
           py::arg("shared_gate"), py::arg("gate"), py::arg("up"), py::arg("shared_down"), py::arg("top_k"),
           py::arg("renormalize"), py::arg("out"), py::arg("fused") = true, py::arg("path") = "auto");
#else
  (void)m;
#endif
}

}  // namespace ninfer::bindings
