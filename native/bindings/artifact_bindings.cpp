#include "bindings/bindings.h"

namespace ninfer::bindings {

void bind_artifact(pybind11::module_& m) {}  // placeholder until the artifact room lands

}  // namespace ninfer::bindings
