#include "bindings/bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "NInfer native core";
  ninfer::bindings::bind_artifact(m);
  ninfer::bindings::bind_ops(m);
  ninfer::bindings::bind_engine(m);
  ninfer::bindings::bind_hybrid_ops(m);
  ninfer::bindings::bind_parallel(m);
  ninfer::bindings::bind_cuda(m);
}
