// Each room of the core registers its own Python bindings into the one `_core` module.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "common/row_sampling.h"
#include "engine/constraint_matcher.h"

namespace ninfer::bindings {

void bind_artifact(pybind11::module_& m);  // artifact_bindings.cpp
void bind_ops(pybind11::module_& m);       // ops_bindings.cpp  (kernels, for tests)
void bind_model_runner(pybind11::module_& m);  // model_runner_bindings.cpp (called by bind_ops)
void bind_engine(pybind11::module_& m);    // engine_bindings.cpp
void bind_hybrid_ops(pybind11::module_& m);  // hybrid_ops_bindings.cpp (GDN, gated attn, MoE)
void bind_parallel(pybind11::module_& m);     // parallel_bindings.cpp (CPU collectives, for tests)
void bind_cuda(pybind11::module_& m);      // cuda_bindings.cpp (CUDA ops, for tests)
void bind_cuda_hybrid(pybind11::module_& m);  // cuda_hybrid_bindings.cpp (called by bind_cuda)
void bind_sampling(pybind11::module_& m);   // sampling_bindings.cpp (called by bind_engine)
void bind_cuda_sampling(pybind11::module_& m);  // cuda_sampling_bindings.cpp (called by bind_sampling)
// A SamplingBatch from a list of row dicts (see _core.sample_rows_host).
SamplingBatch sampling_batch_from(const pybind11::list& rows);  // sampling_bindings.cpp
void bind_cuda_gemv(pybind11::module_& m);    // cuda_gemv_bindings.cpp (called by bind_cuda)
void bind_cuda_quant(pybind11::module_& m);   // cuda_quant_bindings.cpp (called by bind_cuda)
void bind_cuda_moe_decode(pybind11::module_& m);  // cuda_moe_decode_bindings.cpp (called by bind_cuda)
void bind_cuda_fp8_gemm(pybind11::module_& m);  // cuda_fp8_gemm_bindings.cpp (called by bind_cuda)
void bind_grammar(pybind11::module_& m);      // grammar_bindings.cpp (called by bind_engine)
pybind11::dict constraint_stats_dict(const ConstraintStats& stats);  // grammar_bindings.cpp
// Compiles with the GIL released; kind as GrammarKind's name.
CompileOutcome compile_grammar(GrammarCompiler& compiler, const std::string& kind, const std::string& source,
                               const std::string& lead);

}  // namespace ninfer::bindings
