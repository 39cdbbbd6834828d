#include "backends/cuda/cublaslt_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#define NINFER_HAVE_CUBLASLT_HEADERS 1
#endif

namespace ninfer::cuda {

namespace {

// Values from cublasLt.h / cublas_api.h (stable ABI); checked against the header where it
// exists (the GPU machine's toolkit), declared here so CI builds without it.
constexpr int kOpN = 0, kOpT = 1;
constexpr int kComputeF32 = 68;
constexpr int kDescTransA = 3, kDescTransB = 4, kDescAScalePointer = 17, kDescBScalePointer = 18;
constexpr int kDescAScaleMode = 31, kDescBScaleMode = 32;
constexpr int kScaleVec128F32 = 4, kScaleBlk128x128F32 = 5;
constexpr int kPrefMaxWorkspace = 1;
constexpr int kPrefMinAlignA = 5, kPrefMinAlignB = 6, kPrefMinAlignC = 7, kPrefMinAlignD = 8;

struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  unsigned char algo[64];
  size_t workspace_size;
  int state;
  float waves_count;
  int reserved[4];
};

#ifdef NINFER_HAVE_CUBLASLT_HEADERS
static_assert(kOpN == CUBLAS_OP_N && kOpT == CUBLAS_OP_T && kComputeF32 == CUBLAS_COMPUTE_32F);
static_assert(kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA && kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(kDescAScalePointer == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER &&
              kDescBScalePointer == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER);
static_assert(kDescAScaleMode == CUBLASLT_MATMUL_DESC_A_SCALE_MODE &&
              kDescBScaleMode == CUBLASLT_MATMUL_DESC_B_SCALE_MODE);
static_assert(kScaleVec128F32 == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F &&
              kScaleBlk128x128F32 == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
static_assert(kPrefMaxWorkspace == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
static_assert(kPrefMinAlignA == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
              kPrefMinAlignB == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES &&
              kPrefMinAlignC == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES &&
              kPrefMinAlignD == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
static_assert(sizeof(HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t));
static_assert(sizeof(LtFp8Plan::algo) == sizeof(cublasLtMatmulAlgo_t));
#endif

}  // namespace

CublasLtRuntime& CublasLtRuntime::get() {
  static CublasLtRuntime runtime;
  return runtime;
}

template <typename F>
bool CublasLtRuntime::resolve(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(library_, name));
  if (!f) why_ = std::string("libcublasLt lacks ") + name;
  return f != nullptr;
}

CublasLtRuntime::CublasLtRuntime() {
  std::vector<std::string> candidates;
  if (const char* path = std::getenv("NINFER_CUBLASLT_LIBRARY")) candidates.emplace_back(path);
  for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                           "/usr/local/cuda/lib64/libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so"})
    candidates.emplace_back(name);
  for (const auto& name : candidates) {
    library_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library_) break;
  }
  if (!library_) {
    why_ = "libcublasLt could not be loaded (set NINFER_CUBLASLT_LIBRARY or LD_LIBRARY_PATH)";
    return;
  }
  ok_ = resolve(create_, "cublasLtCreate") && resolve(destroy_, "cublasLtDestroy") &&
        resolve(desc_create_, "cublasLtMatmulDescCreate") && resolve(desc_destroy_, "cublasLtMatmulDescDestroy") &&
        resolve(desc_set_, "cublasLtMatmulDescSetAttribute") &&
        resolve(layout_create_, "cublasLtMatrixLayoutCreate") &&
        resolve(layout_destroy_, "cublasLtMatrixLayoutDestroy") &&
        resolve(pref_create_, "cublasLtMatmulPreferenceCreate") &&
        resolve(pref_destroy_, "cublasLtMatmulPreferenceDestroy") &&
        resolve(pref_set_, "cublasLtMatmulPreferenceSetAttribute") &&
        resolve(heuristic_, "cublasLtMatmulAlgoGetHeuristic") && resolve(matmul_, "cublasLtMatmul");
}

void* CublasLtRuntime::create_handle() const {
  if (!ok_) throw std::runtime_error(why_);
  void* handle = nullptr;
  if (const int status = create_(&handle); status != 0)
    throw std::runtime_error("cublasLtCreate failed with status " + std::to_string(status));
  return handle;
}

void CublasLtRuntime::destroy_handle(void* handle) const {
  if (handle && destroy_) destroy_(handle);
}

std::string CublasLtRuntime::plan_fp8_block(void* handle, int64_t m, int64_t n, int64_t k, cudaDataType_t y_type,
                                            bool x_first, size_t max_workspace, uint32_t alignment,
                                            const void* scale_placeholder, LtFp8Plan& plan) const {
  const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                            (x_first ? " (x as A)" : "");
  auto check = [&](int status, const char* what) {
    if (status != 0) throw std::runtime_error(std::string(what) + " failed with status " + std::to_string(status));
  };
  destroy_plan(plan);
  try {
    check(desc_create_(&plan.desc, kComputeF32, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const int32_t op_t = kOpT, op_n = kOpN, w_mode = kScaleBlk128x128F32, x_mode = kScaleVec128F32;
    check(desc_set_(plan.desc, kDescTransA, &op_t, sizeof(op_t)), "set TRANSA");
    check(desc_set_(plan.desc, kDescTransB, &op_n, sizeof(op_n)), "set TRANSB");
    check(desc_set_(plan.desc, kDescAScaleMode, x_first ? &x_mode : &w_mode, sizeof(w_mode)), "set A_SCALE_MODE");
    check(desc_set_(plan.desc, kDescBScaleMode, x_first ? &w_mode : &x_mode, sizeof(x_mode)), "set B_SCALE_MODE");
    check(desc_set_(plan.desc, kDescAScalePointer, &scale_placeholder, sizeof(scale_placeholder)),
          "set A_SCALE_POINTER");
    check(desc_set_(plan.desc, kDescBScalePointer, &scale_placeholder, sizeof(scale_placeholder)),
          "set B_SCALE_POINTER");
    check(layout_create_(&plan.layout_w, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
          "layout w");
    check(layout_create_(&plan.layout_x, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
          "layout x");
    if (x_first)
      check(layout_create_(&plan.layout_y, y_type, static_cast<uint64_t>(m), static_cast<uint64_t>(n), m),
            "layout y");
    else
      check(layout_create_(&plan.layout_y, y_type, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n),
            "layout y");
  } catch (const std::exception& e) {
    destroy_plan(plan);
    return shape + ": " + e.what();
  }
  void* pref = nullptr;
  std::string refused;
  if (pref_create_(&pref) != 0) {
    destroy_plan(plan);
    return shape + ": cublasLtMatmulPreferenceCreate failed";
  }
  const uint64_t ws = max_workspace;
  HeuristicResult results[4] = {};
  int found = 0;
  int status = pref_set_(pref, kPrefMaxWorkspace, &ws, sizeof(ws));
  for (const int attr : {kPrefMinAlignA, kPrefMinAlignB, kPrefMinAlignC, kPrefMinAlignD})
    if (status == 0) status = pref_set_(pref, attr, &alignment, sizeof(alignment));
  if (status == 0)
    status = heuristic_(handle, plan.desc, x_first ? plan.layout_x : plan.layout_w,
                        x_first ? plan.layout_w : plan.layout_x, plan.layout_y, plan.layout_y, pref, 4, results,
                        &found);
  pref_destroy_(pref);
  if (status != 0 || found == 0) {
    destroy_plan(plan);
    return shape + ": no cuBLASLt algorithm (status " + std::to_string(status) + ", " + std::to_string(found) +
           " found)";
  }
  std::memcpy(plan.algo, results[0].algo, sizeof(plan.algo));
  plan.workspace = results[0].workspace_size;
  plan.x_first = x_first;
  return "";
}

void CublasLtRuntime::run_fp8_block(void* handle, LtFp8Plan& plan, const void* w, const float* w_scales,
                                    const void* x, const float* x_scales, void* y, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream) const {
  // The scale pointers live in the descriptor: set for this run (the host-side set is cheap).
  const float* a_scales = plan.x_first ? x_scales : w_scales;
  const float* b_scales = plan.x_first ? w_scales : x_scales;
  int status = desc_set_(plan.desc, kDescAScalePointer, &a_scales, sizeof(a_scales));
  if (status == 0) status = desc_set_(plan.desc, kDescBScalePointer, &b_scales, sizeof(b_scales));
  const float alpha = 1.0f, beta = 0.0f;
  const void* a = plan.x_first ? x : w;
  const void* b = plan.x_first ? w : x;
  if (status == 0)
    status = matmul_(handle, plan.desc, &alpha, a, plan.x_first ? plan.layout_x : plan.layout_w, b,
                     plan.x_first ? plan.layout_w : plan.layout_x, &beta, y, plan.layout_y, y, plan.layout_y,
                     plan.algo, workspace, workspace_bytes, stream);
  if (status != 0)
    throw std::runtime_error("cublasLtMatmul (fp8 block-scaled) failed with status " + std::to_string(status));
}

void CublasLtRuntime::destroy_plan(LtFp8Plan& plan) const {
  if (plan.layout_y) layout_destroy_(plan.layout_y);
  if (plan.layout_x) layout_destroy_(plan.layout_x);
  if (plan.layout_w) layout_destroy_(plan.layout_w);
  if (plan.desc) desc_destroy_(plan.desc);
  plan = LtFp8Plan{};
}

}  // namespace ninfer::cuda
