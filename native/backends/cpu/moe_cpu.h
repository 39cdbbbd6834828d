// Sparse mixture-of-experts routing for Qwen3.5/3.6 MoE layers (spec §2.6): softmax router,
// top-k, renormalisation, grouping of (token, slot) pairs by expert for batched expert GEMMs,
// weighted scatter of expert outputs, and the sigmoid-gated shared expert.
#pragma once

#include <cstdint>
#include <vector>

namespace ninfer::cpu {

// Per token: p = softmax(logits[t, :experts]) in fp32, the top_k largest p in descending order
// (ties go to the lower expert id), divided by their sum when renormalize is true.
// logits [tokens, experts]; expert_ids and weights [tokens, top_k].
void moe_route_softmax_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                            bool renormalize, int32_t* expert_ids, float* weights);

// The routed (token, slot) pairs ordered by expert id, then by token: expert e owns entries
// [offsets[e], offsets[e + 1]) of token and slot. HF adds expert outputs in this order.
struct ExpertGroups {
  std::vector<int64_t> offsets;  // [experts + 1]
  std::vector<int32_t> token;    // [tokens · top_k]
  std::vector<int32_t> slot;     // [tokens · top_k], index into the token's top_k choices
};

// Throws std::invalid_argument if an id is outside [0, experts).
ExpertGroups moe_group_by_expert(const int32_t* expert_ids, int64_t tokens, int64_t top_k,
                                 int64_t experts);

// out[token[r], :] += weight[r] · rows[r, :] for r < count, in order. rows is [count, hidden].
void moe_weighted_scatter_add(const float* rows, int64_t count, int64_t hidden,
                              const int32_t* token, const float* weight, float* out);

// out[t, :] += sigmoid(gate_logit[t]) · shared[t, :]: the shared expert, gated by the scalar
// shared_expert_gate(x) of each token. out and shared are [tokens, hidden].
void moe_add_gated_shared(const float* shared, const float* gate_logit, int64_t tokens,
                          int64_t hidden, float* out);

}  // namespace ninfer::cpu
