// Each room of the core registers its own Python bindings into the one `_core` module.
#pragma once

#include <pybind11/pybind11.h>

namespace ninfer::bindings {

void bind_artifact(pybind11::module_& m);  // artifact_bindings.cpp
void bind_ops(pybind11::module_& m);       // ops_bindings.cpp  (kernels, for tests)
void bind_model_runner(pybind11::module_& m);  // model_runner_bindings.cpp (called by bind_ops)
void bind_engine(pybind11::module_& m);    // engine_bindings.cpp
void bind_hybrid_ops(pybind11::module_& m);  // hybrid_ops_bindings.cpp (GDN, gated attn, MoE)
void bind_cuda(pybind11::module_& m);      // cuda_bindings.cpp (CUDA ops, for tests)
void bind_cuda_hybrid(pybind11::module_& m);  // cuda_hybrid_bindings.cpp (called by bind_cuda)
void bind_cuda_gemv(pybind11::module_& m);    // cuda_gemv_bindings.cpp (called by bind_cuda)

}  // namespace ninfer::bindings
