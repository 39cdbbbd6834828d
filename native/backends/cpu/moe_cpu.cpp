#include "backends/cpu/moe_cpu.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace ninfer::cpu {
namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

}  // namespace

void moe_route_softmax_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                            bool renormalize, int32_t* expert_ids, float* weights) {
  require(tokens >= 0 && experts > 0, "moe_route_softmax_topk: bad dimensions");
  require(top_k >= 1 && top_k <= experts, "moe_route_softmax_topk: top_k must be in [1, experts]");
  require(experts <= INT32_MAX, "moe_route_softmax_topk: too many experts");
  require(logits && expert_ids && weights, "moe_route_softmax_topk: null pointer argument");
  std::vector<float> prob(experts);
  std::vector<int32_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * experts;
    const float peak = *std::max_element(row, row + experts);
    float total = 0.0f;
    for (int64_t e = 0; e < experts; ++e) {
      prob[e] = std::exp(row[e] - peak);
      total += prob[e];
    }
    for (int64_t e = 0; e < experts; ++e) prob[e] /= total;
    std::iota(order.begin(), order.end(), 0);
    const auto ranks_before = [&](int32_t x, int32_t y) {
      return prob[x] > prob[y] || (prob[x] == prob[y] && x < y);
    };
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), ranks_before);
    float chosen = 0.0f;
    for (int64_t i = 0; i < top_k; ++i) chosen += prob[order[i]];
    for (int64_t i = 0; i < top_k; ++i) {
      expert_ids[t * top_k + i] = order[i];
      weights[t * top_k + i] = renormalize ? prob[order[i]] / chosen : prob[order[i]];
    }
  }
}

ExpertGroups moe_group_by_expert(const int32_t* expert_ids, int64_t tokens, int64_t top_k,
                                 int64_t experts) {
  require(tokens >= 0 && top_k >= 1 && experts > 0, "moe_group_by_expert: bad dimensions");
  const int64_t pairs = tokens * top_k;
  ExpertGroups groups;
  groups.offsets.assign(experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = expert_ids[p];
    if (e < 0 || e >= experts)
      throw std::invalid_argument("moe_group_by_expert: expert id " + std::to_string(e) +
                                  " outside [0, " + std::to_string(experts) + ")");
    ++groups.offsets[e + 1];
  }
  std::partial_sum(groups.offsets.begin(), groups.offsets.end(), groups.offsets.begin());
  groups.token.resize(pairs);
  groups.slot.resize(pairs);
  std::vector<int64_t> fill(groups.offsets.begin(), groups.offsets.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {  // token-major scan keeps tokens ascending per expert
    const int64_t at = fill[expert_ids[p]]++;
    groups.token[at] = static_cast<int32_t>(p / top_k);
    groups.slot[at] = static_cast<int32_t>(p % top_k);
  }
  return groups;
}

void moe_weighted_scatter_add(const float* rows, int64_t count, int64_t hidden,
                              const int32_t* token, const float* weight, float* out) {
  require(count >= 0 && hidden > 0, "moe_weighted_scatter_add: bad dimensions");
  for (int64_t r = 0; r < count; ++r) {
    const float* src = rows + r * hidden;
    float* dst = out + static_cast<int64_t>(token[r]) * hidden;
    const float w = weight[r];
    for (int64_t i = 0; i < hidden; ++i) dst[i] += w * src[i];
  }
}

void moe_add_gated_shared(const float* shared, const float* gate_logit, int64_t tokens,
                          int64_t hidden, float* out) {
  require(tokens >= 0 && hidden > 0, "moe_add_gated_shared: bad dimensions");
  for (int64_t t = 0; t < tokens; ++t) {
    const float gate = 1.0f / (1.0f + std::exp(-gate_logit[t]));
    const float* src = shared + t * hidden;
    float* dst = out + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) dst[i] += gate * src[i];
  }
}

}  // namespace ninfer::cpu
