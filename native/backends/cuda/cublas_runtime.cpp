#include "backends/cuda/cublas_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <vector>

#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
#define NINFER_HAVE_CUBLAS_HEADERS 1
#endif

namespace ninfer::cuda {

namespace {

// Values from cublas_api.h (stable ABI); checked against the header where it exists.
constexpr int kOpN = 0, kOpT = 1;
constexpr int kComputeF32 = 68;
constexpr int kGemmDefault = -1;
#ifdef NINFER_HAVE_CUBLAS_HEADERS
static_assert(kOpN == CUBLAS_OP_N && kOpT == CUBLAS_OP_T);
static_assert(kComputeF32 == CUBLAS_COMPUTE_32F && kGemmDefault == CUBLAS_GEMM_DEFAULT);
#endif

}  // namespace

CublasRuntime& CublasRuntime::get() {
  static CublasRuntime runtime;
  return runtime;
}

CublasRuntime::CublasRuntime() {
  std::vector<std::string> candidates;
  if (const char* path = std::getenv("NINFER_CUBLAS_LIBRARY")) candidates.emplace_back(path);
  for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13",
                           "/usr/local/cuda/lib64/libcublas.so"})
    candidates.emplace_back(name);
  for (const auto& name : candidates) {
    library_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library_) break;
  }
  if (!library_) {
    why_ = "libcublas could not be loaded (set NINFER_CUBLAS_LIBRARY or LD_LIBRARY_PATH)";
    return;
  }
  create_ = reinterpret_cast<Create>(dlsym(library_, "cublasCreate_v2"));
  destroy_ = reinterpret_cast<Destroy>(dlsym(library_, "cublasDestroy_v2"));
  set_stream_ = reinterpret_cast<SetStream>(dlsym(library_, "cublasSetStream_v2"));
  gemm_ex_ = reinterpret_cast<GemmEx>(dlsym(library_, "cublasGemmEx"));
  if (!create_ || !destroy_ || !set_stream_ || !gemm_ex_) {
    why_ = "libcublas lacks cublasCreate_v2/cublasSetStream_v2/cublasGemmEx";
    return;
  }
  handle_ = library_;
}

void* CublasRuntime::create_handle(cudaStream_t stream) const {
  if (!available()) throw std::runtime_error(why_);
  void* handle = nullptr;
  if (const int status = create_(&handle); status != 0)
    throw std::runtime_error("cublasCreate failed with status " + std::to_string(status));
  if (const int status = set_stream_(handle, stream); status != 0)
    throw std::runtime_error("cublasSetStream failed with status " + std::to_string(status));
  return handle;
}

void CublasRuntime::destroy_handle(void* handle) const {
  if (handle && destroy_) destroy_(handle);
}

void CublasRuntime::gemm_bf16_rowmajor(void* handle, const void* x, const void* w, float* y, int m, int n,
                                       int k) const {
  // Column-major view: y^T [n, m] = w [k, n]^T · x^T [k, m].
  const float alpha = 1.0f, beta = 0.0f;
  const int status = gemm_ex_(handle, kOpT, kOpN, n, m, k, &alpha, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta, y,
                              CUDA_R_32F, n, kComputeF32, kGemmDefault);
  if (status != 0)
    throw std::runtime_error("cublasGemmEx (bf16 " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                             std::to_string(k) + ") failed with status " + std::to_string(status));
}

}  // namespace ninfer::cuda
