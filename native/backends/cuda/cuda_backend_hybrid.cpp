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
#include "backends/cuda/launchers_hybrid.h"

namespace ninfer::cuda {

namespace {

template <typename T>
T* scratch_of(DeviceScratch& s, int64_t elements, cudaStream_t stream) {
  return static_cast<T*>(s.get(static_cast<size_t>(std::max<int64_t>(elements, 1)) * sizeof(T), stream));
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
  std::vector<GdnSeq> seqs;
  seqs.reserve(slices.size());
  int32_t rows = 0, max_tokens = 0;
  bool any_history = false;
  for (const auto& s : slices) {
    if (s.row_begin != rows || s.num_tokens < 0 || !s.conv_state || !s.ssm_state)
      throw std::invalid_argument("gdn_mixer: slices must tile the rows in order and carry both states");
    seqs.push_back({s.row_begin, s.num_tokens, s.conv_state, s.ssm_state, s.conv_history, s.ssm_history});
    rows += s.num_tokens;
    max_tokens = std::max(max_tokens, s.num_tokens);
    any_history = any_history || s.ssm_history;
  }
  if (rows == 0) return;
  activate();
  const int64_t channels = shape.conv_channels(), kw = shape.key_width(), vw = shape.value_width();
  const int64_t hv = shape.value_heads;
  const auto* seq_dev = stage(gdn_seqs_, std::span<const GdnSeq>(seqs));
  const bool chunked = form == GdnForm::Chunked && !any_history && gdn_chunked_supported(dims);
  note(max_tokens);
  note(chunked);
  if (dry()) return;
  float* conv_out = scratch_of<float>(gdn_conv_out_, rows * channels, stream_);
  float* gates = scratch_of<float>(gdn_gates_, 2 * rows * hv, stream_);
  float* beta = gates;
  float* g = gates + rows * hv;
  const int n = static_cast<int>(seqs.size());
  launch_causal_conv1d_silu(mixed, channels, channels, weights.conv_weight, static_cast<int>(shape.conv_kernel),
                            seq_dev, n, max_tokens, conv_out, channels, stream_);
  launch_l2norm_heads(conv_out, channels, rows, shape.key_heads, shape.key_dim,
                      1.0f / std::sqrt(static_cast<float>(shape.key_dim)), 1e-6f, stream_);
  launch_l2norm_heads(conv_out + kw, channels, rows, shape.key_heads, shape.key_dim, 1.0f, 1e-6f, stream_);
  launch_gdn_gates(b, hv, a, hv, rows, hv, weights.A_log, weights.dt_bias, beta, g, stream_);
  const DeltaRuleArgs args{conv_out, conv_out + kw, channels, conv_out + 2 * kw, channels, g, beta, out, vw};
  // The chunked form only when asked for (GdnForm::Chunked): on the H200 (2026-11-29, 27B
  // shape, one lane of 8192 tokens) it takes 9.9 ms a layer against 6.2 ms for the recurrent
  // kernel, whose fp32 CUDA-core products and per-chunk solve are not yet on tensor cores.
  if (chunked)
    launch_gated_delta_rule_chunked(dims, args, seq_dev, n, stream_);
  else
    launch_gated_delta_rule_recurrent(dims, args, seq_dev, n, stream_);
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

}  // namespace ninfer::cuda
