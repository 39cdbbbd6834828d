// A buffer that only grows, in page-locked host memory (asynchronous copies from and to it are
// really asynchronous) or in device memory. Unlike DeviceScratch it does not bump the scratch
// generation: use it only for memory no captured step graph refers to.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backends/cuda/cuda_check.h"

namespace ninfer::cuda {

class GrowingBuffer {
 public:
  enum class Where { PinnedHost, Device };
  explicit GrowingBuffer(Where where) : where_(where) {}
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  ~GrowingBuffer() { release(); }

  // At least `bytes`; the contents are not kept across growth, and the caller makes sure no
  // copy or kernel still uses the old memory.
  void* get(size_t bytes) {
    if (ptr_ && bytes <= bytes_) return ptr_;
    release();
    const size_t size = bytes + bytes / 2 + 256;
    if (where_ == Where::PinnedHost) NINFER_CUDA_CHECK(cudaMallocHost(&ptr_, size));
    else NINFER_CUDA_CHECK(cudaMalloc(&ptr_, size));
    bytes_ = size;
    return ptr_;
  }

 private:
  void release() {
    if (!ptr_) return;
    if (where_ == Where::PinnedHost) cudaFreeHost(ptr_);
    else cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  Where where_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ninfer::cuda
