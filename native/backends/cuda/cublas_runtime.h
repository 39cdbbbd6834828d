// cuBLAS resolved at run time (dlopen), so the CUDA sources build on machines that have nvcc
// but no cuBLAS headers or libraries (CI) and the same binary uses cuBLAS where it exists.
// Only the few entry points the backend calls are declared, with their documented ABI.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <string>

namespace ninfer::cuda {

class CublasRuntime {
 public:
  // Loads the library on first use; available() is false (with why()) when it cannot be found.
  static CublasRuntime& get();
  bool available() const { return handle_ != nullptr; }
  const std::string& why() const { return why_; }

  // One handle per backend/stream.
  void* create_handle(cudaStream_t stream) const;
  void destroy_handle(void* handle) const;
  // Row-major y[m, n] (f32) = x[m, k] (bf16) · w[n, k]^T (bf16), f32 accumulation.
  void gemm_bf16_rowmajor(void* handle, const void* x, const void* w, float* y, int m, int n, int k) const;

 private:
  CublasRuntime();
  void* library_ = nullptr;
  void* handle_ = nullptr;  // non-null once every symbol resolved
  std::string why_;
  using Create = int (*)(void**);
  using Destroy = int (*)(void*);
  using SetStream = int (*)(void*, cudaStream_t);
  using GemmEx = int (*)(void*, int, int, int, int, int, const void*, const void*, cudaDataType_t, int, const void*,
                         cudaDataType_t, int, const void*, void*, cudaDataType_t, int, int, int);
  Create create_ = nullptr;
  Destroy destroy_ = nullptr;
  SetStream set_stream_ = nullptr;
  GemmEx gemm_ex_ = nullptr;
};

}  // namespace ninfer::cuda
