// Host-side entry points of the Qwen3.5/3.6 hybrid-model kernels (Gated DeltaNet, gated
// attention pieces, MoE routing). Same math as the CPU reference kernels in
// backends/cpu/{gdn_cpu,gated_attention_cpu,moe_cpu}.h; all pointers are device memory and
// every launch is asynchronous on `stream` and checks its launch error.
//
// Sequences of a step are described by a device array of GdnSeq (one per sequence, rows in
// order) that points at each sequence's carried conv and recurrent state, so a decode batch
// of many lanes is one launch per op and the metadata can live in static buffers (graphs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda {

struct GdnSeq {
  int32_t row_begin = 0;           // first row of the sequence in the step's arrays
  int32_t num_tokens = 0;          // its rows
  float* conv_state = nullptr;     // [K-1, channels], oldest row first
  float* ssm_state = nullptr;      // [Hv, dk, dv] fp32
  float* conv_history = nullptr;   // optional: [num_tokens, K-1, channels], the state after each token
  float* ssm_history = nullptr;    // optional: [num_tokens, Hv, dk, dv]
};

// GDN head layout: value head h reads key/query head h / (value_heads / key_heads).
struct GdnDims {
  int32_t key_heads = 0;
  int32_t value_heads = 0;
  int32_t key_dim = 0;
  int32_t value_dim = 0;
};

// True when the delta-rule kernel supports these dims (key_dim 64/128/256, value_dim % 8 == 0).
bool gdn_shape_supported(const GdnDims& shape);

// Causal depthwise conv1d + SiLU over each sequence's rows with carried state (see
// cpu::causal_conv1d_silu): each sequence's conv_state is read, then updated to its last
// kernel-1 input rows. `out` must not alias `x`. kernel 2..4. max_tokens: the largest
// num_tokens of the sequences (sizes the grid).
// overlap: launched overlapping the previous kernel (launch_overlapped.h); with max_tokens <=
// 64 the conv and the state update are one launch.
void launch_causal_conv1d_silu(const float* x, int64_t x_stride, int64_t channels, const float* weight, int kernel,
                               const GdnSeq* seqs, int num_seqs, int max_tokens, float* out, int64_t out_stride,
                               cudaStream_t stream, bool overlap = false);

// In place per head: x <- scale * x * rsqrt(sum x^2 + eps); x is [tokens, heads, head_dim] with
// row stride `row_stride` floats.
void launch_l2norm_heads(float* x, int64_t row_stride, int64_t tokens, int64_t heads, int64_t head_dim, float scale,
                         float eps, cudaStream_t stream);

// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (threshold 20); b/a at their row
// strides, beta/g contiguous [tokens, value_heads].
void launch_gdn_gates(const float* b, int64_t b_stride, const float* a, int64_t a_stride, int64_t tokens,
                      int64_t value_heads, const float* A_log, const float* dt_bias, float* beta, float* g,
                      cudaStream_t stream);

// Token-by-token gated delta rule for every sequence (decode: one token each; also correct for
// any length). q/k normalised already; each sequence's ssm_state is read and updated (and its
// ssm_history, when set, receives the state after every token). out must not overlap inputs.
struct DeltaRuleArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  int64_t qk_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* g = nullptr;     // [rows, Hv]
  const float* beta = nullptr;  // [rows, Hv]
  float* out = nullptr;
  int64_t out_stride = 0;
};
void launch_gated_delta_rule_recurrent(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs,
                                       int num_seqs, cudaStream_t stream);

// The raw gate inputs of launch_gated_delta_rule_recurrent_prepared.
struct GdnRawGates {
  const float* b = nullptr;  // [rows, Hv] at b_stride: beta = sigmoid(b)
  int64_t b_stride = 0;
  const float* a = nullptr;  // [rows, Hv] at a_stride: g = -exp(A_log) * softplus(a + dt_bias)
  int64_t a_stride = 0;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  float q_scale = 1.0f;  // q's L2 norm is scaled by this (1/sqrt(key_dim))
  float eps = 1e-6f;     // of both L2 norms
};
// The same rule with launch_l2norm_heads (q: scale gates.q_scale, k: 1) and launch_gdn_gates
// folded in: args.q / args.k are the raw conv outputs (left unchanged), args.g / args.beta are
// ignored. Decode and verification steps (no chunked slices) run this one launch.
void launch_gated_delta_rule_recurrent_prepared(const GdnDims& shape, const DeltaRuleArgs& args,
                                                const GdnRawGates& gates, const GdnSeq* seqs, int num_seqs,
                                                bool overlap, cudaStream_t stream);

// The chunked form (chunks of 64 tokens, spec §3.1) of the same rule, for prefill: same results
// up to the bf16 rounding of the tensor-core operands (relative ~3e-3; fp32 state and
// accumulation), far fewer sequential steps for long sequences. Ignores ssm_history (use the recurrent form for slices that need
// per-token states). Shapes: gdn_chunked_supported; q, k, v 16-byte aligned with row strides
// that are multiples of 4 floats. `chunks`: the sum over the sequences of gdn_chunk_count(num_tokens);
// `workspace`: gdn_chunked_workspace_floats(shape, chunks) floats of device memory, 16-byte
// aligned.
inline constexpr int32_t kGdnChunk = 64;  // tokens per chunk
// GdnForm::Auto runs slices of at least this many tokens chunked (below, the recurrent kernel
// is faster: bench/bench_cuda_gdn.py).
inline constexpr int32_t kGdnChunkedMinTokens = 64;
bool gdn_chunked_supported(const GdnDims& shape);
int64_t gdn_chunk_count(int64_t tokens);
int64_t gdn_chunked_workspace_floats(const GdnDims& shape, int64_t chunks);
void launch_gated_delta_rule_chunked(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs,
                                     int num_seqs, int chunks, float* workspace, cudaStream_t stream);
// Its two kernels, for timing them apart: the chunk-parallel part (fills the workspace) and the
// sequential one (reads it; updates the states and writes out).
void launch_gdn_chunk_prepare(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs, int num_seqs,
                              int chunks, float* workspace, cudaStream_t stream);
void launch_gdn_chunk_scan(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs, int num_seqs,
                           const float* workspace, cudaStream_t stream);

// out = w * (x * rsqrt(mean(x^2) + eps)) * silu(z) per row of dim floats (out may be x).
void launch_gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, const float* weight, float eps,
                          float* out, cudaStream_t stream, bool overlap = false);

// out = x * rsqrt(mean(x^2) + eps) * weight per row of dim floats (out may be x): the per-head
// norms (q_norm, k_norm) of attention. A warp a row where dim is 128, 256 or 512 and the rows
// are 16-byte aligned (a block of dim threads a row spends most of its time in the block-wide
// reduction when rows are that short), else a block a row.
bool head_rms_norm_fits(int64_t dim);
void launch_head_rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out,
                          cudaStream_t stream, bool overlap = false);

// out = x * rsqrt(mean(x^2) + eps) * (1 + weight) per row of dim floats, with row strides.
void launch_rmsnorm_zero_centered(const float* x, int64_t x_stride, int64_t rows, int64_t dim, const float* weight,
                                  float eps, float* out, int64_t out_stride, cudaStream_t stream);

// [tokens, heads, 2*head_dim] -> query and gate [tokens, heads, head_dim] (per-head split).
void launch_split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim, float* query,
                             float* gate, cudaStream_t stream);

// x[i] *= sigmoid(gate[i]).
void launch_sigmoid_gate_multiply(float* x, const float* gate, int64_t count, cudaStream_t stream);

// Softmax over each token's expert logits, the top_k largest in descending order (ties to the
// lower id), renormalised to sum 1 when `renormalize`. experts <= 512, top_k <= 16.
void launch_moe_route_softmax_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                                   bool renormalize, int32_t* expert_ids, float* weights, cudaStream_t stream);

// out[t, :] += sum over the token's top_k slots s of weights[t, s] * rows[row_of[t, s], :]
// (rows: the expert outputs grouped by expert; row_of maps each (token, slot) to its row, or
// is null when row t*top_k+s belongs to (t, s)).
// Deterministic: one thread per output element sums in slot order.
void launch_moe_combine(const float* rows, int64_t hidden, const int32_t* row_of, const float* weights, int64_t tokens,
                        int64_t top_k, float* out, cudaStream_t stream);

// out[t, :] += sigmoid(gate_logit[t]) * shared[t, :].
void launch_moe_add_gated_shared(const float* shared, const float* gate_logit, int64_t tokens, int64_t hidden,
                                 float* out, cudaStream_t stream);

// Expert matmul per (token, slot) pair, expert ids read on the device (decode, no grouping):
// y[p, r] = w[ids[p] * expert_rows + r, :] . bf16(x[token(p), :]) for r < rows_out, where w is a
// stack of experts of expert_rows rows of width k (k % 8 == 0, k <= 12288), token(p) = p / top_k,
// or p when x_per_pair.
void launch_moe_gemv(const uint16_t* w, int64_t expert_rows, int64_t rows_out, int64_t k, const int32_t* ids,
                     int64_t pairs, int64_t top_k, const float* x, bool x_per_pair, float* y, cudaStream_t stream);

// out[p, j] = silu(in[p, j]) * in[p, ff + j] for in [rows, 2 ff], out [rows, ff].
void launch_swiglu_halves(const float* in, int64_t rows, int64_t ff, float* out, cudaStream_t stream);

// out[r, :] = [a[r, :] | b[r, :]].
void launch_concat_columns(const float* a, int64_t a_cols, const float* b, int64_t b_cols, int64_t rows, float* out,
                           cudaStream_t stream);

}  // namespace ninfer::cuda
