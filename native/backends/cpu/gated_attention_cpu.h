// Pieces of the Qwen3.5/3.6 gated full-attention layer (spec §2.3) that differ from Llama-style
// attention, plus the zero-centred "(1 + w)" RMSNorm the hybrid models use everywhere except in
// the GDN output norm. The attention itself (causal GQA over the KV cache) is the ordinary one.
//
// Layer data flow: q_proj → split_query_gate → rmsnorm_zero_centered on q and k heads →
// rope_partial_neox on q and k → attention → sigmoid_gate_multiply(out, gate) → o_proj.
#pragma once

#include <cstdint>

namespace ninfer::cpu {

// q_proj output [tokens, heads, 2·head_dim] → query [tokens, heads, head_dim] and gate
// [tokens, heads, head_dim]. The split is per head: head h's query is its first head_dim
// features and its gate the next head_dim (spec §8 item 2). Outputs must not overlap the input.
void split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim,
                      float* query, float* gate);

// out = x · rsqrt(mean(x²) + eps) · (1 + weight), per row of `dim` floats; weight is [dim] and is
// shared by all rows (q_norm/k_norm apply it per head). Row strides in floats; out may be x.
void rmsnorm_zero_centered(const float* x, int64_t x_stride, int64_t rows, int64_t dim,
                           const float* weight, float eps, float* out, int64_t out_stride);

// Default RoPE inverse frequencies for the rotary part: inv_freq[j] = theta^(-2j / rotary_dim),
// j < rotary_dim / 2, evaluated as HF does (fp32 exponent, then 1 / pow).
void rope_default_inv_freq(double theta, int64_t rotary_dim, float* inv_freq);

// In place, NeoX-style ("rotate_half") RoPE on the first rotary_dim features of every head of x
// [tokens, heads, head_dim] (row stride in floats); features past rotary_dim are untouched.
// Within the rotary part, feature j pairs with j + rotary_dim/2 and turns by the angle
// positions[t] · inv_freq[j]; cos and sin are multiplied by attention_scaling (1 except YaRN).
void rope_partial_neox(float* x, int64_t row_stride, int64_t tokens, int64_t heads,
                       int64_t head_dim, int64_t rotary_dim, const int64_t* positions,
                       const float* inv_freq, float attention_scaling = 1.0f);

// In place: x[i] *= sigmoid(gate[i]) for i < count (the attention output gate).
void sigmoid_gate_multiply(float* x, const float* gate, int64_t count);

}  // namespace ninfer::cpu
