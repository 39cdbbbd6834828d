// A device error the process cannot recover from: an illegal address, a launch failure, a
// lost device. Such errors are sticky (the device context stays broken, so every later call
// fails too), which is why the engine does not treat them like an out-of-memory condition or
// a failed check: it stops, and the server exits so that a supervisor can start a fresh
// process. Out of memory is not one of these; backends report it as an ordinary exception
// whose message says "out of memory".
#pragma once

#include <stdexcept>
#include <string>

namespace ninfer {

class DeviceFatalError : public std::runtime_error {
 public:
  explicit DeviceFatalError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ninfer
