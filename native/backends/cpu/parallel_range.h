// A parallel-for callback that kernels accept so that they stay independent of any thread pool.
#pragma once

#include <cstdint>
#include <functional>

namespace ninfer::cpu {

// Runs body(begin, end) over disjoint sub-ranges that together cover [0, count). A pool-backed
// implementation may call body concurrently; the kernels that take one only write to data owned
// by the index range they are given.
using ParallelRange =
    std::function<void(int64_t count, const std::function<void(int64_t begin, int64_t end)>& body)>;

// Runs body over the whole range on the calling thread.
inline void run_serial(int64_t count, const std::function<void(int64_t, int64_t)>& body) {
  if (count > 0) body(0, count);
}

inline void run_range(const ParallelRange* parallel, int64_t count,
                      const std::function<void(int64_t, int64_t)>& body) {
  if (parallel != nullptr && *parallel) {
    (*parallel)(count, body);
  } else {
    run_serial(count, body);
  }
}

}  // namespace ninfer::cpu
