// The CPU backend's hybrid-model ops: thin adapters from the Backend contract to the plain
// kernels of gdn_cpu, gated_attention_cpu and moe_cpu, spread over the backend's thread pool.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gated_attention_cpu.h"
#include "backends/cpu/gdn_cpu.h"
#include "backends/cpu/moe_cpu.h"
#include "backends/cpu/parallel_range.h"
#include "backends/quantized_weight.h"

namespace ninfer::cpu {

namespace {

constexpr int64_t kElementwiseGrain = 1 << 14;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Rows [first_row, first_row + rows) of a 2-D weight, as a weight of its own.
Weight row_block(const Weight& w, int64_t first_row, int64_t rows) { return weight_rows(w, first_row, rows); }

}  // namespace

void CpuBackend::fill_zero(float* x, int64_t n) {
  if (n > 0) std::memset(x, 0, static_cast<size_t>(n) * sizeof(float));
}

void CpuBackend::copy(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void CpuBackend::gdn_mixer(const GdnShape& shape, const GdnLayerWeights& weights,
                           std::span<const GdnSlice> slices, float* mixed, const float* z, const float* b,
                           const float* a, float* out, GdnForm form) {
  GdnLayerParams layer;
  layer.dims = GdnDims{shape.key_heads, shape.value_heads, shape.key_dim, shape.value_dim};
  layer.conv_kernel = shape.conv_kernel;
  layer.norm_eps = shape.norm_eps;
  layer.chunk_size = shape.chunk_size;
  layer.conv_weight = weights.conv_weight;
  layer.A_log = weights.A_log;
  layer.dt_bias = weights.dt_bias;
  layer.norm_weight = weights.norm_weight;
  std::vector<GdnSequence> sequences;
  sequences.reserve(slices.size());
  for (const auto& s : slices)
    sequences.push_back({s.row_begin, s.num_tokens, s.conv_state, s.ssm_state, s.conv_history, s.ssm_history});
  const DeltaRuleForm rule = form == GdnForm::Chunked     ? DeltaRuleForm::Chunked
                             : form == GdnForm::Recurrent ? DeltaRuleForm::Recurrent
                                                          : DeltaRuleForm::Auto;
  const ParallelRange parallel = [this](int64_t count, const std::function<void(int64_t, int64_t)>& body) {
    pool_.parallel_ranges(count, 1, body);
  };
  gdn_mixer_batch(layer, sequences, mixed, z, b, a, out, rule, &parallel);
}

void CpuBackend::split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim,
                                  float* query, float* gate) {
  cpu::split_query_gate(q_proj_out, tokens, heads, head_dim, query, gate);
}

void CpuBackend::sigmoid_mul(float* x, const float* gate, int64_t n) {
  pool_.parallel_ranges(n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] *= sigmoid(gate[i]);
  });
}

void CpuBackend::add_sigmoid_gated(float* y, const float* x, const float* gate_logits, int64_t rows,
                                   int64_t cols) {
  moe_add_gated_shared(x, gate_logits, rows, cols, y);
}

void CpuBackend::moe_experts(const float* x, int64_t tokens, int64_t hidden, const float* router_logits,
                             const MoeExperts& experts, float* out) {
  const int64_t e_count = experts.num_experts, ff = experts.ff, top_k = experts.top_k;
  experts.check(hidden);
  fill_zero(out, tokens * hidden);
  if (tokens <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(tokens * top_k));
  std::vector<float> route_weights(ids.size());
  moe_route_softmax_topk(router_logits, tokens, e_count, top_k, experts.renormalize, ids.data(),
                         route_weights.data());
  const ExpertGroups groups = moe_group_by_expert(ids.data(), tokens, top_k, e_count);
  const auto need = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  };
  std::vector<float> pair_weights;
  const int64_t first = experts.first_expert;
  for (int64_t e = first; e < first + experts.held_experts(); ++e) {
    const int64_t begin = groups.offsets[e], n = groups.offsets[e + 1] - begin;
    if (n == 0) continue;
    need(moe_rows_, n * hidden), need(moe_gate_, n * ff), need(moe_up_, n * ff), need(moe_out_, n * hidden);
    pair_weights.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      const int32_t t = groups.token[begin + r];
      std::memcpy(moe_rows_.data() + r * hidden, x + static_cast<int64_t>(t) * hidden,
                  static_cast<size_t>(hidden) * sizeof(float));
      pair_weights[r] = route_weights[static_cast<size_t>(t * top_k + groups.slot[begin + r])];
    }
    const Weight gate = row_block(experts.gate_up, (e - first) * 2 * ff, ff);
    const Weight up = row_block(experts.gate_up, (e - first) * 2 * ff + ff, ff);
    const Weight down = row_block(experts.down, (e - first) * hidden, hidden);
    const MatmulOutput gate_up[] = {{&gate, nullptr, moe_gate_.data()}, {&up, nullptr, moe_up_.data()}};
    matmul_many(moe_rows_.data(), n, gate_up);
    swiglu(moe_gate_.data(), moe_up_.data(), n * ff, moe_gate_.data());
    matmul(moe_gate_.data(), n, down, nullptr, moe_out_.data());
    moe_weighted_scatter_add(moe_out_.data(), n, hidden, groups.token.data() + begin, pair_weights.data(), out);
  }
}

void CpuBackend::concat_columns(const float* a, int64_t a_cols, const float* b, int64_t b_cols, int64_t rows,
                                float* out) {
  const int64_t width = a_cols + b_cols;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out + r * width, a + r * a_cols, static_cast<size_t>(a_cols) * sizeof(float));
    std::memcpy(out + r * width + a_cols, b + r * b_cols, static_cast<size_t>(b_cols) * sizeof(float));
  }
}

}  // namespace ninfer::cpu
