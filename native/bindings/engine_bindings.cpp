#include "bindings/bindings.h"

namespace ninfer::bindings {

void bind_engine(pybind11::module_& m) {}  // placeholder until the engine room lands

}  // namespace ninfer::bindings
