// Gated DeltaNet (Qwen3.5/3.6 "linear_attention" layers) on the CPU: plain fp32 kernels over raw
// pointers with explicit dimensions. Activations are token-major ([tokens, features], row-major);
// a row stride lets a kernel read a slice of a wider buffer (e.g. q inside the conv output).
//
// Layer data flow (spec §2.4): mixed = in_proj_qkv(x) → causal_conv1d_silu → split q|k|v →
// l2norm_heads(q, scale dk^-0.5), l2norm_heads(k) → gdn_gates(b, a) → gated delta rule
// (chunked for prefill, recurrent for decode) → gated_rmsnorm(·, z) → out_proj.
// gdn_mixer_core / gdn_mixer_batch run every step between the projections.
#pragma once

#include <cstdint>
#include <span>

#include "backends/cpu/parallel_range.h"

namespace ninfer::cpu {

// Head layout of a GDN layer. Value head j reads query/key head j / (value_heads / key_heads):
// the value heads of one key head are adjacent (repeat_interleave grouping, spec §2.4 step 6).
struct GdnDims {
  int64_t key_heads = 0;    // Hk (linear_num_key_heads)
  int64_t value_heads = 0;  // Hv (linear_num_value_heads), a multiple of key_heads
  int64_t key_dim = 0;      // dk (linear_key_head_dim)
  int64_t value_dim = 0;    // dv (linear_value_head_dim)

  int64_t key_width() const { return key_heads * key_dim; }
  int64_t value_width() const { return value_heads * value_dim; }
  int64_t conv_channels() const { return 2 * key_width() + value_width(); }  // q | k | v
  int64_t state_floats() const { return value_heads * key_dim * value_dim; }
  void validate() const;  // throws std::invalid_argument on non-positive or non-divisible dims
};

// Causal depthwise conv1d over a run of tokens followed by SiLU:
//   out[t, c] = silu( Σ_{j<K} weight[c, j] · in[t - (K-1) + j, c] )
// where inputs before the run come from conv_state. conv_state is [K-1, channels], oldest row
// first: the last K-1 pre-conv input rows (zeros for a fresh sequence); it is updated to the last
// K-1 input rows of this run, so consecutive calls equal one call over the concatenated tokens.
// weight is [channels, K] (HF conv1d.weight [channels, 1, K]). out may be the same buffer as x
// (with the same stride).
void causal_conv1d_silu(const float* x, int64_t x_stride, int64_t tokens, int64_t channels,
                        const float* weight, int64_t kernel, float* conv_state, float* out,
                        int64_t out_stride, const ParallelRange* parallel = nullptr);

// In place, per head: x ← scale · x · rsqrt(Σ x² + eps). x is [tokens, heads, head_dim] with
// consecutive tokens row_stride floats apart. Use scale = head_dim^-0.5 for queries, 1 for keys.
void l2norm_heads(float* x, int64_t row_stride, int64_t tokens, int64_t heads, int64_t head_dim,
                  float scale, float eps = 1e-6f);

// beta = sigmoid(b) and the log-decay g = -exp(A_log) · softplus(a + dt_bias) (softplus with
// torch's threshold 20). b and a are [tokens, value_heads] at their row strides; A_log and
// dt_bias are [value_heads]; beta and g are written contiguous [tokens, value_heads].
void gdn_gates(const float* b, int64_t b_stride, const float* a, int64_t a_stride, int64_t tokens,
               int64_t value_heads, const float* A_log, const float* dt_bias, float* beta,
               float* g);

// Inputs of the gated delta rule for one sequence. q and k must already be L2-normalised and q
// scaled by dk^-0.5 (l2norm_heads). Row strides are in floats between consecutive tokens.
struct DeltaRuleIo {
  const float* q = nullptr;  // [tokens, Hk, dk]
  const float* k = nullptr;  // [tokens, Hk, dk]
  int64_t qk_stride = 0;
  const float* v = nullptr;  // [tokens, Hv, dv]
  int64_t v_stride = 0;
  const float* g = nullptr;     // [tokens, Hv] log decay (≤ 0)
  const float* beta = nullptr;  // [tokens, Hv]
  float* out = nullptr;         // [tokens, Hv, dv]; must not overlap the inputs
  int64_t out_stride = 0;
};

// Token-by-token gated delta rule (spec §2.4 step 7): per value head, S ← exp(g)·S; δ = β(v − Sᵀk);
// S ← S + k⊗δ; o = Sᵀq. state is the fp32 recurrent state [Hv, dk, dv], read and updated.
// If state_history is not null it receives the state after every token, [tokens, Hv, dk, dv]
// (for speculative rollback, spec §3.2).
void gated_delta_rule_recurrent(const GdnDims& dims, int64_t tokens, const DeltaRuleIo& io,
                                float* state, float* state_history = nullptr,
                                const ParallelRange* parallel = nullptr);

// The same recurrence evaluated chunk-parallel (spec §3.1, WY/UT form) for prefill. Equal to the
// recurrent form up to rounding; a trailing partial chunk needs no padding.
void gated_delta_rule_chunked(const GdnDims& dims, int64_t tokens, const DeltaRuleIo& io,
                              float* state, int64_t chunk_size = 64,
                              const ParallelRange* parallel = nullptr);

// Gated RMSNorm of the GDN output (spec §2.4 step 9): out = w ⊙ (x · rsqrt(mean(x²) + eps)) ⊙
// silu(z) per row of `dim` floats, with a plain weight w (not 1 + w). x, z, out are contiguous
// [rows, dim]; out may be x.
void gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, const float* weight,
                   float eps, float* out);

enum class DeltaRuleForm { Auto, Chunked, Recurrent };  // Auto: chunked when tokens > 1

struct GdnLayerParams {
  GdnDims dims;
  int64_t conv_kernel = 4;
  float norm_eps = 1e-6f;
  int64_t chunk_size = 64;
  const float* conv_weight = nullptr;  // [conv_channels, conv_kernel]
  const float* A_log = nullptr;        // [Hv]
  const float* dt_bias = nullptr;      // [Hv]
  const float* norm_weight = nullptr;  // [dv]
};

// Everything of a GDN layer between its projections, for one sequence of `tokens` tokens.
//   mixed: [tokens, conv_channels], the in_proj_qkv output; overwritten (conv output, normed q/k)
//   z: [tokens, Hv·dv]; b, a: [tokens, Hv] (contiguous)
//   conv_state [K-1, conv_channels] and ssm_state [Hv, dk, dv]: the sequence's carried state
//   out: [tokens, Hv·dv], the input of out_proj
void gdn_mixer_core(const GdnLayerParams& layer, int64_t tokens, float* mixed, const float* z,
                    const float* b, const float* a, float* conv_state, float* ssm_state,
                    float* out, DeltaRuleForm form = DeltaRuleForm::Auto,
                    const ParallelRange* parallel = nullptr);

// One sequence of a batched GDN call: its rows in the step's arrays and its state slot.
struct GdnSequence {
  int64_t row_begin = 0;
  int64_t num_tokens = 0;
  float* conv_state = nullptr;  // [K-1, conv_channels]
  float* ssm_state = nullptr;   // [Hv, dk, dv]
};

// gdn_mixer_core for several sequences whose rows are stacked in mixed/z/b/a/out; the
// sequences must tile the rows in order (row_begin = sum of the earlier num_tokens), as the
// slices of a BatchPlan do. Each sequence takes the chunked form when it has more than one token
// (form Auto); work is spread over (sequence, head) pairs so a decode batch of many lanes
// parallelises as well as one long prefill.
void gdn_mixer_batch(const GdnLayerParams& layer, std::span<const GdnSequence> sequences,
                     float* mixed, const float* z, const float* b, const float* a, float* out,
                     DeltaRuleForm form = DeltaRuleForm::Auto,
                     const ParallelRange* parallel = nullptr);

}  // namespace ninfer::cpu
