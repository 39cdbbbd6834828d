// The hybrid-model ops of the CUDA backend (Qwen3.5/3.6): state memory, the Gated DeltaNet
// mixer, the gated-attention pieces and the sparse MoE experts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers_hybrid.h"

namespace ninfer::cuda {

namespace {

constexpr int64_t kMoeUngroupedPairs = 128;  // (token, slot) pairs up to which experts run ungrouped
constexpr int64_t kChunkedRoundRows = 16384;  // rows of chunked slices per launch (bounds the workspace)

template <typename T>
T* scratch_of(DeviceScratch& s, int64_t elements, cudaStream_t stream) {
  return static_cast<T*>(s.get(static_cast<size_t>(std::max<int64_t>(elements, 1)) * sizeof(T), stream));
}

// One launch of the chunked delta rule: `count` sequences from seqs[first], `chunks` chunks.
struct ChunkedRound {
  int first = 0, count = 0, chunks = 0;
};

// The first n_chunked of `seqs` run chunked in rounds of at most kChunkedRoundRows rows: each
// round takes the next segment (a multiple of the chunk size) of every slice not yet done; the
// state carries over from round to round. This bounds the workspace. The rounds' sequences are
// appended to `seqs`.
std::vector<ChunkedRound> append_chunked_rounds(std::vector<GdnSeq>& seqs, int n_chunked) {
  std::vector<ChunkedRound> rounds;
  if (n_chunked <= 0) return rounds;
  int32_t longest = 0;
  for (int i = 0; i < n_chunked; ++i) longest = std::max(longest, seqs[i].num_tokens);
  const auto segment = static_cast<int32_t>(
      std::max<int64_t>(kGdnChunk, kChunkedRoundRows / n_chunked / kGdnChunk * kGdnChunk));
  for (int32_t begin = 0; begin < longest; begin += segment) {
    ChunkedRound round{static_cast<int>(seqs.size()), 0, 0};
    for (int i = 0; i < n_chunked; ++i) {
      GdnSeq part = seqs[i];
      if (part.num_tokens <= begin) continue;
      part.row_begin += begin;
      part.num_tokens = std::min(segment, part.num_tokens - begin);
      round.chunks += static_cast<int>(gdn_chunk_count(part.num_tokens));
      ++round.count;
      seqs.push_back(part);
    }
    rounds.push_back(round);
  }
  return rounds;
}

// Rows [first, first + count) of a bf16 weight, as a weight of its own.
Weight row_block(const Weight& w, int64_t first, int64_t count) {
  return Weight{w.dtype, count, w.cols, static_cast<const uint16_t*>(w.data) + first * w.cols};
}

}  // namespace

void CudaBackend::fill_zero(float* x, int64_t n) {
  if (n <= 0 || dry()) return;
  activate();
  NINFER_CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(float), stream_));
}

void CudaBackend::copy(float* dst, const float* src, int64_t n) {
  if (n <= 0 || dry()) return;
  activate();
  NINFER_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::gdn_mixer(const GdnShape& shape, const GdnLayerWeights& weights, std::span<const GdnSlice> slices,
                            float* mixed, const float* z, const float* b, const float* a, float* out, GdnForm form) {
  const GdnDims dims{static_cast<int32_t>(shape.key_heads), static_cast<int32_t>(shape.value_heads),
                     static_cast<int32_t>(shape.key_dim), static_cast<int32_t>(shape.value_dim)};
  if (!gdn_shape_supported(dims))
    throw std::invalid_argument("CUDA gdn_mixer: heads " + std::to_string(shape.key_heads) + "/" +
                                std::to_string(shape.value_heads) + " of dims " + std::to_string(shape.key_dim) + "/" +
                                std::to_string(shape.value_dim) +
                                " are not supported (value heads a multiple of key heads, key_dim 64/128/256, "
                                "value_dim a multiple of 8)");
  if (slices.empty()) return;
  // Slices for the chunked form first (Auto: no history and at least kGdnChunkedMinTokens tokens),
  // then the rest, which run token by token; the conv and norms take all of them.
  const bool chunk_ok = form != GdnForm::Recurrent && gdn_chunked_supported(dims);
  auto wants_chunked = [&](const GdnSlice& s) {
    return chunk_ok && !s.ssm_history && s.num_tokens > 0 &&
           (form == GdnForm::Chunked || s.num_tokens >= kGdnChunkedMinTokens);
  };
  std::vector<GdnSeq> seqs;
  seqs.reserve(slices.size());
  int32_t rows = 0, max_tokens = 0;
  for (const auto& s : slices) {
    if (s.row_begin != rows || s.num_tokens < 0 || !s.conv_state || !s.ssm_state)
      throw std::invalid_argument("gdn_mixer: slices must tile the rows in order and carry both states");
    rows += s.num_tokens;
    max_tokens = std::max(max_tokens, s.num_tokens);
  }
  for (const bool chunked : {true, false})
    for (const auto& s : slices)
      if (wants_chunked(s) == chunked)
        seqs.push_back({s.row_begin, s.num_tokens, s.conv_state, s.ssm_state, s.conv_history, s.ssm_history});
  if (rows == 0) return;
  const int n = static_cast<int>(seqs.size());
  const auto n_chunked = static_cast<int>(std::count_if(slices.begin(), slices.end(), wants_chunked));
  const std::vector<ChunkedRound> rounds = append_chunked_rounds(seqs, n_chunked);
  int64_t max_round_chunks = 0;
  for (const auto& round : rounds) max_round_chunks = std::max<int64_t>(max_round_chunks, round.chunks);
  activate();
  const int64_t channels = shape.conv_channels(), kw = shape.key_width(), vw = shape.value_width();
  const int64_t hv = shape.value_heads;
  const auto* seq_dev = stage(gdn_seqs_, std::span<const GdnSeq>(seqs));
  note(max_tokens);
  note(n_chunked);
  note(static_cast<int64_t>(rounds.size()));
  if (dry()) return;
  float* conv_out = scratch_of<float>(gdn_conv_out_, rows * channels, stream_);
  float* gates = scratch_of<float>(gdn_gates_, 2 * rows * hv, stream_);
  float* workspace =
      rounds.empty() ? nullptr
                     : scratch_of<float>(gdn_chunk_workspace_, gdn_chunked_workspace_floats(dims, max_round_chunks),
                                         stream_);
  float* beta = gates;
  float* g = gates + rows * hv;
  launch_causal_conv1d_silu(mixed, channels, channels, weights.conv_weight, static_cast<int>(shape.conv_kernel),
                            seq_dev, n, max_tokens, conv_out, channels, stream_);
  launch_l2norm_heads(conv_out, channels, rows, shape.key_heads, shape.key_dim,
                      1.0f / std::sqrt(static_cast<float>(shape.key_dim)), 1e-6f, stream_);
  launch_l2norm_heads(conv_out + kw, channels, rows, shape.key_heads, shape.key_dim, 1.0f, 1e-6f, stream_);
  launch_gdn_gates(b, hv, a, hv, rows, hv, weights.A_log, weights.dt_bias, beta, g, stream_);
  const DeltaRuleArgs args{conv_out, conv_out + kw, channels, conv_out + 2 * kw, channels, g, beta, out, vw};
  for (const auto& round : rounds)
    launch_gated_delta_rule_chunked(dims, args, seq_dev + round.first, round.count, round.chunks, workspace, stream_);
  if (n > n_chunked) launch_gated_delta_rule_recurrent(dims, args, seq_dev + n_chunked, n - n_chunked, stream_);
  launch_gated_rmsnorm(out, z, rows * hv, shape.value_dim, weights.norm_weight, shape.norm_eps, out, stream_);
}

void CudaBackend::split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim,
                                   float* query, float* gate) {
  if (dry()) return;
  activate();
  launch_split_query_gate(q_proj_out, tokens, heads, head_dim, query, gate, stream_);
}

void CudaBackend::sigmoid_mul(float* x, const float* gate, int64_t n) {
  if (dry()) return;
  activate();
  launch_sigmoid_gate_multiply(x, gate, n, stream_);
}

void CudaBackend::add_sigmoid_gated(float* y, const float* x, const float* gate_logits, int64_t rows, int64_t cols) {
  if (dry()) return;
  activate();
  launch_moe_add_gated_shared(x, gate_logits, rows, cols, y, stream_);
}

void CudaBackend::concat_columns(const float* a, int64_t a_cols, const float* b, int64_t b_cols, int64_t rows,
                                 float* out) {
  if (dry()) return;
  activate();
  launch_concat_columns(a, a_cols, b, b_cols, rows, out, stream_);
}

// Routing on the device. Small batches (decode: at most kMoeUngroupedPairs (token, slot) pairs)
// run each pair's expert as a GEMV that reads the expert id on the device: four launches, no
// host round trip. Larger ones bring the ids to the host (one synchronisation per MoE layer)
// to group the pairs by expert and run each used expert's matmuls on its gathered rows. A
// combine kernel adds the weighted expert outputs per token.
void CudaBackend::moe_experts(const float* x, int64_t tokens, int64_t hidden, const float* router_logits,
                              const MoeExperts& experts, float* out) {
  const int64_t e_count = experts.num_experts, ff = experts.ff, top_k = experts.top_k;
  if (e_count <= 0 || ff <= 0 || top_k <= 0 || top_k > e_count)
    throw std::invalid_argument("moe_experts: need num_experts > 0, ff > 0 and top_k in [1, num_experts]");
  if (experts.gate_up.rows != e_count * 2 * ff || experts.gate_up.cols != hidden ||
      experts.down.rows != e_count * hidden || experts.down.cols != ff)
    throw std::invalid_argument("moe_experts: stacked expert weights do not match [E·2ff, H] and [E·H, ff]");
  if (experts.gate_up.dtype != DType::BF16 || experts.down.dtype != DType::BF16)
    throw std::invalid_argument("CUDA moe_experts: expert weights must be uploaded by this backend (bf16)");
  fill_zero(out, tokens * hidden);
  if (tokens <= 0) return;
  const bool ungrouped =
      tokens * top_k <= kMoeUngroupedPairs && hidden % 8 == 0 && ff % 8 == 0 && hidden <= 12288 && ff <= 12288;
  if (!ungrouped) not_graphable();  // the grouped path reads the expert ids on the host
  if (dry()) return;
  activate();
  const int64_t pairs = tokens * top_k;
  auto* route = scratch_of<float>(moe_route_, 2 * pairs, stream_);
  auto* ids_dev = reinterpret_cast<int32_t*>(route);
  float* route_weights = route + pairs;
  launch_moe_route_softmax_topk(router_logits, tokens, e_count, top_k, experts.renormalize, ids_dev, route_weights,
                                stream_);
  if (ungrouped) {
    float* gate_up = scratch_of<float>(moe_x_, pairs * 2 * ff, stream_);
    float* act = scratch_of<float>(moe_gate_, pairs * ff, stream_);
    float* y = scratch_of<float>(moe_y_, pairs * hidden, stream_);
    launch_moe_gemv(static_cast<const uint16_t*>(experts.gate_up.data), 2 * ff, 2 * ff, hidden, ids_dev, pairs, top_k,
                    x, false, gate_up, stream_);
    launch_swiglu_halves(gate_up, pairs, ff, act, stream_);
    launch_moe_gemv(static_cast<const uint16_t*>(experts.down.data), hidden, hidden, ff, ids_dev, pairs, top_k, act,
                    true, y, stream_);
    launch_moe_combine(y, hidden, nullptr, route_weights, tokens, top_k, out, stream_);
    return;
  }
  std::vector<int32_t> ids(static_cast<size_t>(pairs));
  NINFER_CUDA_CHECK(cudaMemcpyAsync(ids.data(), ids_dev, ids.size() * 4, cudaMemcpyDeviceToHost, stream_));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));

  // Counting sort by expert, tokens ascending within an expert: plan = [gather rows | row_of].
  std::vector<int64_t> offsets(static_cast<size_t>(e_count + 1), 0);
  for (const int32_t e : ids) {
    if (e < 0 || e >= e_count) throw std::runtime_error("moe_experts: the router produced an invalid expert id");
    ++offsets[static_cast<size_t>(e) + 1];
  }
  for (int64_t e = 0; e < e_count; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> plan(static_cast<size_t>(2 * pairs));
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t row = fill[static_cast<size_t>(ids[static_cast<size_t>(p)])]++;
    plan[static_cast<size_t>(row)] = static_cast<int32_t>(p / top_k);          // token of grouped row
    plan[static_cast<size_t>(pairs + p)] = static_cast<int32_t>(row);          // row of (token, slot)
  }
  const auto* plan_dev = stage(moe_plan_, std::span<const int32_t>(plan));
  float* xg = scratch_of<float>(moe_x_, pairs * hidden, stream_);
  float* gate = scratch_of<float>(moe_gate_, pairs * ff, stream_);
  float* up = scratch_of<float>(moe_up_, pairs * ff, stream_);
  float* y = scratch_of<float>(moe_y_, pairs * hidden, stream_);
  launch_gather_rows(x, hidden, plan_dev, pairs, xg, stream_);
  for (int64_t e = 0; e < e_count; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - begin;
    if (n == 0) continue;
    const Weight wg = row_block(experts.gate_up, e * 2 * ff, ff), wu = row_block(experts.gate_up, e * 2 * ff + ff, ff);
    const MatmulOutput gate_up[] = {{&wg, nullptr, gate + begin * ff}, {&wu, nullptr, up + begin * ff}};
    matmul_many(xg + begin * hidden, n, gate_up);
  }
  launch_swiglu(gate, up, pairs * ff, gate, stream_);
  for (int64_t e = 0; e < e_count; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - begin;
    if (n == 0) continue;
    const Weight wd = row_block(experts.down, e * hidden, hidden);
    matmul(gate + begin * ff, n, wd, nullptr, y + begin * hidden);
  }
  launch_moe_combine(y, hidden, plan_dev + pairs, route_weights, tokens, top_k, out, stream_);
}

}  // namespace ninfer::cuda
