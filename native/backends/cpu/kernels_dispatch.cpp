// Picks the kernel table once from the CPU's features; tests may switch it.
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "backends/cpu/kernels.h"

namespace ninfer::cpu {

namespace {

// Whether this build has the set and the CPU runs it.
bool runnable(std::string_view name) {
  const CpuFeatures f = detect_cpu_features();
  if (name == "scalar") return true;
  if (name == "avx2") return f.avx2_fma_f16c;
  if (name == "avxvnni") return f.avx2_fma_f16c && f.avxvnni;
  if (name == "avx512vnni") return f.avx2_fma_f16c && f.avx512_f_bw_dq_vl_vnni;
  return false;
}

// Looks up a table by name; null when this build or CPU cannot run it.
const CpuKernels* kernels_named(std::string_view name) {
  if (!runnable(name)) return nullptr;
  if (name == "scalar") return &kScalarKernels;
#if NINFER_HAVE_AVX2_KERNELS
  if (name == "avx2") return &kAvx2Kernels;
  if (name == "avxvnni") {
    static const CpuKernels vnni = avxvnni_kernels();
    return &vnni;
  }
#endif
#if NINFER_HAVE_AVX512_KERNELS
  if (name == "avx512vnni") {
    static const CpuKernels vnni512 = avx512vnni_kernels();
    return &vnni512;
  }
#endif
  return nullptr;
}

// The best set the CPU has, among those this build has. The sets sum int8 block products in
// different orders, so their logits differ in the last bits; tests compare within that
// tolerance rather than pinning the default to one set.
const CpuKernels* best_kernels() {
  CpuFeatures features = detect_cpu_features();
#if !NINFER_HAVE_AVX512_KERNELS
  features.avx512_f_bw_dq_vl_vnni = false;
#endif
#if !NINFER_HAVE_AVX2_KERNELS
  features = CpuFeatures{};
#endif
  if (const CpuKernels* k = kernels_named(best_kernel_name(features))) return k;
  return &kScalarKernels;
}

std::atomic<const CpuKernels*> g_active{nullptr};  // null until first use

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  f.avx2_fma_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  f.avxvnni = __builtin_cpu_supports("avxvnni");
  f.avx512_f_bw_dq_vl_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512vnni");
#endif
  return f;
}

std::string_view best_kernel_name(const CpuFeatures& f) {
  if (!f.avx2_fma_f16c) return "scalar";
  if (f.avx512_f_bw_dq_vl_vnni) return "avx512vnni";  // Intel since Ice Lake, AMD since Zen 4
  if (f.avxvnni) return "avxvnni";                     // Alder Lake and later client cores
  return "avx2";
}

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
