#include "bindings/bindings.h"

namespace ninfer::bindings {

void bind_ops(pybind11::module_& m) {}  // placeholder until the ops room lands

}  // namespace ninfer::bindings
