#include "backends/cuda/nccl_collective.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ninfer::cuda {

namespace {

// The NCCL ABI this file uses (nccl.h, stable since NCCL 2.0): opaque communicators, int
// result codes, and these enum values.
using NcclComm = void*;
constexpr int kNcclSuccess = 0;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclSum = 0;

struct NcclLibrary {
  using InitAll = int (*)(NcclComm*, int, const int*);
  using Destroy = int (*)(NcclComm);
  using AllReduce = int (*)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t);
  using AllGather = int (*)(const void*, void*, size_t, int, NcclComm, cudaStream_t);
  using ErrorString = const char* (*)(int);

  static const NcclLibrary& get() {
    static const NcclLibrary library;
    return library;
  }

  void check(int status, const char* call) const {
    if (status == kNcclSuccess) return;
    throw std::runtime_error(std::string(call) + " failed: " + (error_string ? error_string(status) : "NCCL error") +
                             " (" + std::to_string(status) + ")");
  }

  InitAll init_all = nullptr;
  Destroy destroy = nullptr;
  AllReduce all_reduce = nullptr;
  AllGather all_gather = nullptr;
  ErrorString error_string = nullptr;

 private:
  NcclLibrary() {
    void* handle = nullptr;
    std::string tried;
    const char* configured = std::getenv("NINFER_NCCL_LIBRARY");
    for (const char* name : {configured, "libnccl.so.2", "libnccl.so"}) {
      if (!name) continue;
      tried += std::string(tried.empty() ? "" : ", ") + name;
      if ((handle = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!handle)
      throw std::runtime_error("libnccl could not be loaded (tried " + tried +
                               "); pip install nvidia-nccl-cu13 and set NINFER_NCCL_LIBRARY to its lib/libnccl.so.2");
    init_all = reinterpret_cast<InitAll>(dlsym(handle, "ncclCommInitAll"));
    destroy = reinterpret_cast<Destroy>(dlsym(handle, "ncclCommDestroy"));
    all_reduce = reinterpret_cast<AllReduce>(dlsym(handle, "ncclAllReduce"));
    all_gather = reinterpret_cast<AllGather>(dlsym(handle, "ncclAllGather"));
    error_string = reinterpret_cast<ErrorString>(dlsym(handle, "ncclGetErrorString"));
    if (!init_all || !destroy || !all_reduce || !all_gather)
      throw std::runtime_error("libnccl lacks ncclCommInitAll/ncclCommDestroy/ncclAllReduce/ncclAllGather");
  }
};

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(NcclComm comm, int device, int rank, int size)
      : comm_(comm), device_(device), rank_(rank), size_(size) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~NcclCollective() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) NcclLibrary::get().destroy(comm_);
  }
  NcclCollective(const NcclCollective&) = delete;
  NcclCollective& operator=(const NcclCollective&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* x, int64_t n) override {
    if (n == 0) return;
    const NcclLibrary& nccl = NcclLibrary::get();
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    nccl.check(nccl.all_reduce(x, x, static_cast<size_t>(n), kNcclFloat32, kNcclSum, comm_, stream_), "ncclAllReduce");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void all_gather(const float* x, int64_t n, float* out) override {
    if (n == 0) return;
    const NcclLibrary& nccl = NcclLibrary::get();
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    nccl.check(nccl.all_gather(x, out, static_cast<size_t>(n), kNcclFloat32, comm_, stream_), "ncclAllGather");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  NcclComm comm_ = nullptr;
  int device_ = 0, rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::vector<std::unique_ptr<Collective>> make_nccl_collective_group(const std::vector<int>& devices) {
  if (devices.empty()) throw std::invalid_argument("an NCCL group needs at least one device");
  const NcclLibrary& nccl = NcclLibrary::get();
  std::vector<NcclComm> comms(devices.size(), nullptr);
  nccl.check(nccl.init_all(comms.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Collective>> ranks;
  const int size = static_cast<int>(devices.size());
  for (int r = 0; r < size; ++r)
    ranks.push_back(std::make_unique<NcclCollective>(comms[static_cast<size_t>(r)], devices[static_cast<size_t>(r)], r,
                                                     size));
  return ranks;
}

}  // namespace ninfer::cuda
