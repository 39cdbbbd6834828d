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

bool cpu_has_avxvnni() {
#if NINFER_HAVE_AVX2_KERNELS
  return cpu_has_avx2() && __builtin_cpu_supports("avxvnni");
#else
  return false;
#endif
}

bool cpu_has_avx512vnni() {
#if NINFER_HAVE_AVX512_KERNELS
  return cpu_has_avxvnni() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// Looks up a table by name; null when this build or CPU cannot run it.
const CpuKernels* kernels_named(std::string_view name) {
  if (name == "scalar") return &kScalarKernels;
#if NINFER_HAVE_AVX2_KERNELS
  if (name == "avx2" && cpu_has_avx2()) return &kAvx2Kernels;
  if (name == "avxvnni" && cpu_has_avxvnni()) {
    static const CpuKernels vnni = avxvnni_kernels();
    return &vnni;
  }
#endif
#if NINFER_HAVE_AVX512_KERNELS
  if (name == "avx512vnni" && cpu_has_avx512vnni()) {
    static const CpuKernels vnni512 = avx512vnni_kernels();
    return &vnni512;
  }
#endif
  return nullptr;
}

const CpuKernels* best_kernels() {
  // avx512vnni is opt-in for now: it sums block products in another order, which flips a
  // greedy token of the embedded model in the end-to-end answer test.
  for (const char* name : {"avxvnni", "avx2"})
    if (const CpuKernels* k = kernels_named(name)) return k;
  return &kScalarKernels;
}

std::atomic<const CpuKernels*> g_active{nullptr};  // null until first use

}  // namespace

const CpuKernels& cpu_kernels() {
  const CpuKernels* active = g_active.load(std::memory_order_acquire);
  if (active) return *active;
  const char* forced = std::getenv("NINFER_CPU_KERNELS");
  const CpuKernels* chosen = forced ? kernels_named(forced) : nullptr;
  if (!chosen) chosen = best_kernels();
  const CpuKernels* expected = nullptr;
  g_active.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel);
  return *g_active.load(std::memory_order_acquire);
}

void select_cpu_kernels(std::string_view name) {
  if (name == "auto") {
    g_active = best_kernels();
    return;
  }
  if (name != "scalar" && name != "avx2" && name != "avxvnni" && name != "avx512vnni")
    throw std::invalid_argument("unknown CPU kernel set '" + std::string(name) +
                                "' (expected auto, scalar, avx2, avxvnni or avx512vnni)");
  const CpuKernels* k = kernels_named(name);
  if (!k) throw std::runtime_error("CPU kernel set '" + std::string(name) + "' is not supported by this CPU or build");
  g_active = k;
}

}  // namespace ninfer::cpu
