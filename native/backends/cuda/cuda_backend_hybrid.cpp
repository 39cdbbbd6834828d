// The hybrid-model ops of the CUDA backend (Qwen3.5/3.6): state memory, the Gated DeltaNet
// mixer and the gated-attention pieces (the sparse MoE experts: cuda_backend_moe.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_block_gemm.h"
#include "backends/cuda/launchers_fp8_prefill.h"
#include "backends/cuda/launchers_hybrid.h"

namespace ninfer::cuda {

namespace {

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
  gdn_mixer_into(shape, weights, slices, mixed, z, b, a, out, form, nullptr);
}

void CudaBackend::gdn_mixer_projected(const GdnShape& shape, const GdnLayerWeights& weights,
                                      std::span<const GdnSlice> slices, float* mixed, const float* z, const float* b,
                                      const float* a, float* out, const Weight& out_proj, float* y) {
  int64_t rows = 0;
  for (const auto& s : slices) rows += s.num_tokens;
  const int64_t dv = shape.value_dim;
  if (rows > 16 && is_block_quantized(out_proj.dtype) && fp8_fused_producers_enabled() &&
      gated_rmsnorm_to_fp8_fits(out, z, weights.norm_weight, dv)) {
    note(-19);
    if (dry()) return gdn_mixer(shape, weights, slices, mixed, z, b, a, out, GdnForm::Auto);
    activate();
    if (Fp8BlockGemm* fp8 = fp8_gemm_taking(out_proj, rows)) {
      // The gated norm writes the projection's e4m3 operand, not out's f32 (the same codes,
      // see launch_gated_rmsnorm_to_fp8_activations); out keeps the delta rule's output.
      const Fp8ActivationSink sink = fp8->activation_sink(rows, out_proj.cols);
      gdn_mixer_into(shape, weights, slices, mixed, z, b, a, out, GdnForm::Auto, &sink);
      if (fp8->matmul(out_proj, y)) return;
      finish_gdn_norm(out, z, rows, shape, weights.norm_weight, nullptr, false);
      return matmul(out, rows, out_proj, nullptr, y);
    }
  }
  Backend::gdn_mixer_projected(shape, weights, slices, mixed, z, b, a, out, out_proj, y);
}

void CudaBackend::gdn_mixer_into(const GdnShape& shape, const GdnLayerWeights& weights,
                                 std::span<const GdnSlice> slices, float* mixed, const float* z, const float* b,
                                 const float* a, float* out, GdnForm form, const Fp8ActivationSink* norm_sink) {
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
                            seq_dev, n, max_tokens, conv_out, channels, stream_, overlap_launches_);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(shape.key_dim));
  if (rounds.empty()) {
    // Decode and verification: token by token, the q/k norms and the gates inside the rule.
    const DeltaRuleArgs args{conv_out, conv_out + kw, channels, conv_out + 2 * kw, channels, nullptr, nullptr, out, vw};
    const GdnRawGates raw{b, hv, a, hv, weights.A_log, weights.dt_bias, q_scale, 1e-6f};
    launch_gated_delta_rule_recurrent_prepared(dims, args, raw, seq_dev, n, overlap_launches_, stream_);
    finish_gdn_norm(out, z, rows, shape, weights.norm_weight, norm_sink, overlap_launches_);
    return;
  }
  launch_l2norm_heads(conv_out, channels, rows, shape.key_heads, shape.key_dim, q_scale, 1e-6f, stream_);
  launch_l2norm_heads(conv_out + kw, channels, rows, shape.key_heads, shape.key_dim, 1.0f, 1e-6f, stream_);
  launch_gdn_gates(b, hv, a, hv, rows, hv, weights.A_log, weights.dt_bias, beta, g, stream_);
  const DeltaRuleArgs args{conv_out, conv_out + kw, channels, conv_out + 2 * kw, channels, g, beta, out, vw};
  for (const auto& round : rounds)
    launch_gated_delta_rule_chunked(dims, args, seq_dev + round.first, round.count, round.chunks, workspace, stream_);
  if (n > n_chunked) launch_gated_delta_rule_recurrent(dims, args, seq_dev + n_chunked, n - n_chunked, stream_);
  finish_gdn_norm(out, z, rows, shape, weights.norm_weight, norm_sink, false);
}

void CudaBackend::finish_gdn_norm(float* out, const float* z, int64_t rows, const GdnShape& shape,
                                  const float* norm_weight, const Fp8ActivationSink* norm_sink, bool overlap) {
  if (norm_sink)
    launch_gated_rmsnorm_to_fp8_activations(out, z, shape.value_heads, shape.value_dim, norm_weight, shape.norm_eps,
                                            *norm_sink, stream_);
  else
    launch_gated_rmsnorm(out, z, rows * shape.value_heads, shape.value_dim, norm_weight, shape.norm_eps, out, stream_,
                         overlap);
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

}  // namespace ninfer::cuda
