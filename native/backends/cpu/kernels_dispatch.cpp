// Picks the kernel table once from the CPU's features; tests may switch it.
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "backends/cpu/kernels.h"

namespace ninfer::cpu {

namespace {

bool cpu_has_avx2() {
#if NINFER_HAVE_AVX2_KERNELS
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

const CpuKernels* best_kernels() {
#if NINFER_HAVE_AVX2_KERNELS
  if (cpu_has_avx2()) return &kAvx2Kernels;
#endif
  return &kScalarKernels;
}

const CpuKernels* initial_kernels() {
  const char* forced = std::getenv("NINFER_CPU_KERNELS");
  if (forced && std::string(forced) == "scalar") return &kScalarKernels;
  return best_kernels();
}

std::atomic<const CpuKernels*> g_active{initial_kernels()};

}  // namespace

const CpuKernels& cpu_kernels() { return *g_active.load(std::memory_order_relaxed); }

void select_cpu_kernels(std::string_view name) {
  if (name == "auto") {
    g_active = best_kernels();
  } else if (name == "scalar") {
    g_active = &kScalarKernels;
  } else if (name == "avx2") {
    if (!cpu_has_avx2())
      throw std::runtime_error("AVX2 kernels requested but this CPU or build lacks AVX2/FMA/F16C");
#if NINFER_HAVE_AVX2_KERNELS
    g_active = &kAvx2Kernels;
#endif
  } else {
    throw std::invalid_argument("unknown CPU kernel set '" + std::string(name) +
                                "' (expected auto, scalar or avx2)");
  }
}

}  // namespace ninfer::cpu
