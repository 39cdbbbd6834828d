// The collectives tensor-parallel ranks use, behind one small interface: the CPU group
// (threads of one process over shared memory) runs the sharded models in CI; a device group
// (NCCL) implements the same contract with device pointers on the rank's stream.
//
// Every rank of a group calls the same collectives in the same order with the same sizes;
// each call returns once this rank's output is complete. Buffers are the rank's backend
// memory (host memory for the CPU group).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace ninfer {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x[0, n) becomes the element-wise sum of every rank's x[0, n). Every rank gets the same
  // values bit for bit (the sum is taken in rank order, whoever computes it).
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  // out[r·n, (r+1)·n) = rank r's x[0, n) for every rank r (out holds size()·n floats).
  virtual void all_gather(const float* x, int64_t n, float* out) = 0;
};

// A group of `size` ranks that are threads of this process: element i of the result is the
// Collective of rank i, to be used by exactly one thread. The ranks share the group's state,
// which lives as long as any of them.
std::vector<std::unique_ptr<Collective>> make_cpu_collective_group(int size);

}  // namespace ninfer
