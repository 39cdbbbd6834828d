// Host-side entry points of every CUDA kernel: the one dispatch place between the backend
// (plain C++) and the kernel templates (*.cuh). All pointers are device memory; each launch
// is asynchronous on `stream` and checks its launch error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/attention_plan.h"

namespace ninfer::cuda {

using bf16_bits = uint16_t;  // bf16 elements as seen from host code

// --- conversion and fills -----------------------------------------------------------------
void launch_f32_to_bf16(const float* x, bf16_bits* y, int64_t n, cudaStream_t stream);
// w[i] = bf16(uniform(-scale, scale)) from a counter hash of (seed, i).
void launch_random_bf16(bf16_bits* w, int64_t n, uint64_t seed, float scale, cudaStream_t stream);

// --- matmul ------------------------------------------------------------------------------
inline constexpr int kGemvMaxJobs = 4;
inline constexpr int kGemvMaxRows = 16;  // largest m of the hand GEMV
struct GemvJob {
  const bf16_bits* w = nullptr;  // [rows, k]
  const float* bias = nullptr;   // [rows] or null
  float* y = nullptr;            // [m, rows]
  int32_t rows = 0;
};
// Scratch of the stream-K GEMV for grids of up to max_blocks blocks (partial sums of tiles that
// blocks share, and one counter a block). Made once per stream with gemv_workspace_at on
// gemv_workspace_bytes of zeroed device memory; launches leave it ready for the next one.
struct GemvWorkspace {
  float* partials = nullptr;
  int32_t* counters = nullptr;
  int64_t max_blocks = 0;
};
int64_t gemv_workspace_blocks(int num_sms);  // enough for any grid on a device of num_sms SMs
size_t gemv_workspace_bytes(int64_t max_blocks);
GemvWorkspace gemv_workspace_at(void* memory, int64_t max_blocks);

struct GemvOptions {
  GemvWorkspace workspace;        // required; launches on one workspace must be stream-ordered
  bool accumulate = false;        // y_j += x · w_j^T (+ bias_j) instead of y_j = ...
  // Launch with programmatic stream serialization: the GEMV starts streaming its weights while
  // the previous kernel of the stream finishes (kernels that call allow_dependent_launch()),
  // and reads x only once that kernel has completed.
  bool overlap_previous = false;
  int variant = -1;               // one of the benchmark's kernel shapes; -1: the launcher's choice
};
// y_j[m, rows_j] = x[m, k] · w_j^T (+ bias_j) for up to kGemvMaxJobs weights of width k in one
// launch. Needs 1 <= m <= kGemvMaxRows and k % 8 == 0.
void launch_gemv_bf16(const GemvJob* jobs, int num_jobs, const float* x, int m, int k, const GemvOptions& options,
                      cudaStream_t stream);
int gemv_variant_count();
const char* gemv_variant_name(int variant);
// Reads `bytes` (a multiple of 16) of device memory and stores nothing: the read-bandwidth
// ceiling for the GEMV benchmark. `sink` is one writable word.
void launch_read_stream(const void* data, int64_t bytes, uint32_t* sink, int num_sms, cudaStream_t stream);
// y[m, n] += bias[n].
void launch_add_bias(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream);

// --- elementwise ---------------------------------------------------------------------------
void launch_embedding(const bf16_bits* table, int64_t cols, const int32_t* tokens, int64_t n, float* out,
                      cudaStream_t stream);
// rms_norm, swiglu and add_rms_norm may overlap the previous kernel (launch_overlapped.h): they
// let the next kernel (a GEMV) start streaming its weights early, and with overlap_previous
// they start before the previous kernel (a GEMV) has finished and wait for it on the device.
void launch_rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps, float* y,
                     cudaStream_t stream, bool overlap_previous = false);
void launch_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                 const int32_t* positions, const float* inv_freq, float attention_factor, cudaStream_t stream);
void launch_swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream,
                   bool overlap_previous = false);
void launch_add(float* y, const float* x, int64_t n, cudaStream_t stream);
// h += branch, then y = rms_norm(h) per row of cols ([rows, cols] each; y must not alias h).
void launch_add_rms_norm(float* h, const float* branch, int64_t rows, int64_t cols, const float* weight, float eps,
                         float* y, cudaStream_t stream, bool overlap_previous = false);
void launch_gather_rows(const float* src, int64_t cols, const int32_t* rows, int64_t n, float* dst,
                        cudaStream_t stream);

// --- KV cache and attention ----------------------------------------------------------------
// Row r of k/v ([rows, num_kv_heads * head_dim] f32) goes to cache slot slots[r] =
// page * kPageTokens + position % kPageTokens of `layer`, stored as bf16.
void launch_kv_write(const KvLayout& kv, int64_t head_dim, const float* k, const float* v, const int32_t* slots,
                     int64_t rows, cudaStream_t stream);

// True when the attention kernels support this head_dim (64, 128 or 256).
bool attention_head_dim_supported(int64_t head_dim);

struct AttentionArgs {
  KvLayout kv;
  const int32_t* pages = nullptr;  // the plan's concatenated page tables
  const float* q = nullptr;        // [rows, num_heads, head_dim]
  float* out = nullptr;            // [rows, num_heads, head_dim]
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  float scale = 0.0f;
};

// Split-KV attention for `num_items` single query rows. With splits > 1 each row's keys are
// cut in `splits` ranges of `chunk` keys (a multiple of 64) whose partial softmax states go
// to `partials` (num_items * num_heads * splits * (head_dim + 2) floats) and are merged by a
// second kernel.
void launch_decode_attention(const AttentionArgs& args, const DecodeItem* items, int num_items, int splits,
                             int chunk, float* partials, cudaStream_t stream);
// Shape of the prefill kernel; 0 picks the measured default for the head dim. kv_stages (1 or
// 2): K/V pages single- or double-buffered in shared memory.
struct PrefillKernelConfig {
  int kv_stages = 0;
};
// Causal attention of blocks of query rows over their slice's pages with warpgroup tensor-core
// MMA (needs sm_90a).
void launch_prefill_attention(const AttentionArgs& args, const PrefillItem* items, int num_items,
                              cudaStream_t stream, PrefillKernelConfig config = {});

}  // namespace ninfer::cuda
