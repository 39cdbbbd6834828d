// Launchers of the hybrid-model kernels (see launchers_hybrid.h).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_gdn.cuh"
#include "backends/cuda/kernels_gdn_chunk_prepare.cuh"
#include "backends/cuda/kernels_gdn_chunk_scan.cuh"
#include "backends/cuda/kernels_hybrid.cuh"
#include "backends/cuda/launch_overlapped.h"
#include "backends/cuda/launchers_hybrid.h"

namespace ninfer::cuda {

namespace {

constexpr int kThreads = 256;

unsigned int blocks_of(int64_t n, int threads = kThreads) {
  return static_cast<unsigned int>(std::max<int64_t>(1, (n + threads - 1) / threads));
}

int norm_threads(int64_t dim) { return dim >= 2048 ? 1024 : (dim >= 512 ? 256 : 128); }

template <int K>
void conv_for(const float* x, int64_t x_stride, int64_t channels, const float* weight, const GdnSeq* seqs,
              int num_seqs, int max_tokens, float* out, int64_t out_stride, cudaStream_t stream, bool overlap) {
  const unsigned int tiles = blocks_of(channels, kernels::kConvChannelsPerBlock);
  const auto token_tiles =
      static_cast<unsigned int>((max_tokens + kernels::kConvTokensPerBlock - 1) / kernels::kConvTokensPerBlock);
  const dim3 grid(tiles, static_cast<unsigned int>(num_seqs), token_tiles);
  if (token_tiles == 1) {  // decode, verification: the state update inside the conv
    launch_overlapped(overlap, grid, dim3(kernels::kConvChannelsPerBlock), 0, stream,
                      kernels::causal_conv1d_silu<K, true>, x, x_stride, channels, weight, seqs, out, out_stride);
    return;
  }
  kernels::causal_conv1d_silu<K, false><<<grid, kernels::kConvChannelsPerBlock, 0, stream>>>(
      x, x_stride, channels, weight, seqs, out, out_stride);
  NINFER_CUDA_CHECK_LAUNCH();
  kernels::conv_state_update<K><<<dim3(tiles, static_cast<unsigned int>(num_seqs)), kernels::kConvChannelsPerBlock, 0,
                                  stream>>>(x, x_stride, channels, seqs);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gdn_shape_supported(const GdnDims& s) {
  return s.key_heads > 0 && s.value_heads > 0 && s.value_heads % s.key_heads == 0 &&
         (s.key_dim == 64 || s.key_dim == 128 || s.key_dim == 256) && s.value_dim > 0 &&
         s.value_dim % kernels::kDeltaRuleCols == 0;
}

void launch_causal_conv1d_silu(const float* x, int64_t x_stride, int64_t channels, const float* weight, int kernel,
                               const GdnSeq* seqs, int num_seqs, int max_tokens, float* out, int64_t out_stride,
                               cudaStream_t stream, bool overlap) {
  if (num_seqs <= 0 || max_tokens <= 0 || channels <= 0) return;
  if (x == out) throw std::invalid_argument("causal_conv1d_silu (CUDA): out must not alias x");
  switch (kernel) {
    case 2:
      conv_for<2>(x, x_stride, channels, weight, seqs, num_seqs, max_tokens, out, out_stride, stream, overlap);
      break;
    case 3:
      conv_for<3>(x, x_stride, channels, weight, seqs, num_seqs, max_tokens, out, out_stride, stream, overlap);
      break;
    case 4:
      conv_for<4>(x, x_stride, channels, weight, seqs, num_seqs, max_tokens, out, out_stride, stream, overlap);
      break;
    default: throw std::invalid_argument("causal_conv1d_silu (CUDA): kernel size " + std::to_string(kernel) +
                                         " is not supported (2..4)");
  }
}

void launch_l2norm_heads(float* x, int64_t row_stride, int64_t tokens, int64_t heads, int64_t head_dim, float scale,
                         float eps, cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0) return;
  constexpr int kWarps = 8;
  kernels::l2norm_heads<<<blocks_of(tokens * heads, kWarps), kWarps * 32, 0, stream>>>(x, row_stride, tokens, heads,
                                                                                        head_dim, scale, eps);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_gdn_gates(const float* b, int64_t b_stride, const float* a, int64_t a_stride, int64_t tokens,
                      int64_t value_heads, const float* A_log, const float* dt_bias, float* beta, float* g,
                      cudaStream_t stream) {
  if (tokens <= 0) return;
  kernels::gdn_gates<<<blocks_of(tokens * value_heads), kThreads, 0, stream>>>(b, b_stride, a, a_stride, tokens,
                                                                               value_heads, A_log, dt_bias, beta, g);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_gated_delta_rule_recurrent(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs,
                                       int num_seqs, cudaStream_t stream) {
  if (num_seqs <= 0) return;
  if (!gdn_shape_supported(shape))
    throw std::invalid_argument("gated delta rule (CUDA): key_dim " + std::to_string(shape.key_dim) + " / value_dim " +
                                std::to_string(shape.value_dim) + " not supported (key_dim 64/128/256, value_dim % 8)");
  const dim3 grid(static_cast<unsigned int>(shape.value_dim / kernels::kDeltaRuleCols),
                  static_cast<unsigned int>(shape.value_heads), static_cast<unsigned int>(num_seqs));
  const GdnRawGates none{};
  switch (shape.key_dim) {
    case 64: kernels::gated_delta_rule_recurrent<4, false><<<grid, 128, 0, stream>>>(shape, args, seqs, none); break;
    case 128: kernels::gated_delta_rule_recurrent<8, false><<<grid, 128, 0, stream>>>(shape, args, seqs, none); break;
    default: kernels::gated_delta_rule_recurrent<16, false><<<grid, 128, 0, stream>>>(shape, args, seqs, none); break;
  }
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_gated_delta_rule_recurrent_prepared(const GdnDims& shape, const DeltaRuleArgs& args,
                                                const GdnRawGates& gates, const GdnSeq* seqs, int num_seqs,
                                                bool overlap, cudaStream_t stream) {
  if (num_seqs <= 0) return;
  if (!gdn_shape_supported(shape))
    throw std::invalid_argument("gated delta rule (CUDA): key_dim " + std::to_string(shape.key_dim) + " / value_dim " +
                                std::to_string(shape.value_dim) + " not supported (key_dim 64/128/256, value_dim % 8)");
  if (!gates.a || !gates.b || !gates.A_log || !gates.dt_bias)
    throw std::invalid_argument("gated delta rule (CUDA): the prepared form needs a, b, A_log and dt_bias");
  const dim3 grid(static_cast<unsigned int>(shape.value_dim / kernels::kDeltaRuleCols),
                  static_cast<unsigned int>(shape.value_heads), static_cast<unsigned int>(num_seqs));
  auto launch = [&](auto kernel) {
    launch_overlapped(overlap, grid, dim3(128), 0, stream, kernel, shape, args, seqs, gates);
  };
  switch (shape.key_dim) {
    case 64: launch(kernels::gated_delta_rule_recurrent<4, true>); break;
    case 128: launch(kernels::gated_delta_rule_recurrent<8, true>); break;
    default: launch(kernels::gated_delta_rule_recurrent<16, true>); break;
  }
}

bool gdn_chunked_supported(const GdnDims& s) {
  return gdn_shape_supported(s) && (s.key_dim == 64 || s.key_dim == 128) && s.value_dim % 32 == 0;
}

int64_t gdn_chunk_count(int64_t tokens) { return (tokens + kernels::kChunk - 1) / kernels::kChunk; }

int64_t gdn_chunked_workspace_floats(const GdnDims& shape, int64_t chunks) {
  return chunks * kernels::ChunkWorkspace{shape.key_heads, shape.value_heads, shape.key_dim, shape.value_dim}
                      .chunk_floats();
}

namespace {

// > 48 KiB of dynamic shared memory needs opting in, once per kernel.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  NINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int DK>
void prepare_for(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs, int num_seqs, int chunks,
                 float* workspace, cudaStream_t stream) {
  const size_t smem = kernels::PrepareSmem<DK>::floats(shape.value_dim) * sizeof(float);
  static size_t allowed = 0;  // the opt-in grows with value_dim
  if (smem > allowed) {
    allow_smem(kernels::gdn_chunk_prepare<DK>, smem);
    allowed = smem;
  }
  kernels::gdn_chunk_prepare<DK>
      <<<dim3(static_cast<unsigned int>(shape.key_heads), static_cast<unsigned int>(chunks)),
         kernels::kPrepareThreads, smem, stream>>>(shape, args, seqs, num_seqs, workspace);
  NINFER_CUDA_CHECK_LAUNCH();
}

template <int DK, int NT>
void scan_for(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs, int num_seqs,
              const float* workspace, cudaStream_t stream) {
  using Scan = kernels::ScanShape<DK, NT>;
  constexpr size_t kSmem = Scan::kBytes;
  static const bool configured = (allow_smem(kernels::gdn_chunk_scan<DK, NT>, kSmem), true);
  (void)configured;
  const dim3 grid(static_cast<unsigned int>(shape.value_dim / NT), static_cast<unsigned int>(shape.value_heads),
                  static_cast<unsigned int>(num_seqs));
  kernels::gdn_chunk_scan<DK, NT><<<grid, Scan::kThreads, kSmem, stream>>>(shape, args, seqs, workspace);
  NINFER_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_chunked(const GdnDims& shape, const DeltaRuleArgs& args, const void* workspace) {
  if (!gdn_chunked_supported(shape))
    throw std::invalid_argument("chunked gated delta rule (CUDA): key_dim " + std::to_string(shape.key_dim) +
                                " / value_dim " + std::to_string(shape.value_dim) +
                                " not supported (key_dim 64/128, value_dim % 32)");
  if (!aligned16(args.q) || !aligned16(args.k) || !aligned16(args.v) || !aligned16(workspace) ||
      args.qk_stride % 4 != 0 || args.v_stride % 4 != 0)
    throw std::invalid_argument("chunked gated delta rule (CUDA): q, k, v and the workspace must be 16-byte "
                                "aligned and the q/k and v row strides multiples of 4 floats");
}

}  // namespace

void launch_gdn_chunk_prepare(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs, int num_seqs,
                              int chunks, float* workspace, cudaStream_t stream) {
  if (num_seqs <= 0 || chunks <= 0) return;
  check_chunked(shape, args, workspace);
  if (chunks > 65535) throw std::invalid_argument("chunked gated delta rule (CUDA): more than 65535 chunks a launch");
  if (shape.key_dim == 64)
    prepare_for<64>(shape, args, seqs, num_seqs, chunks, workspace, stream);
  else
    prepare_for<128>(shape, args, seqs, num_seqs, chunks, workspace, stream);
}

void launch_gdn_chunk_scan(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs, int num_seqs,
                           const float* workspace, cudaStream_t stream) {
  if (num_seqs <= 0) return;
  check_chunked(shape, args, workspace);
  const bool wide = shape.value_dim % 64 == 0;  // 64-column tiles: one copy of W, Q, K for twice the columns
  if (shape.key_dim == 64)
    wide ? scan_for<64, 64>(shape, args, seqs, num_seqs, workspace, stream)
         : scan_for<64, 32>(shape, args, seqs, num_seqs, workspace, stream);
  else
    wide ? scan_for<128, 64>(shape, args, seqs, num_seqs, workspace, stream)
         : scan_for<128, 32>(shape, args, seqs, num_seqs, workspace, stream);
}

void launch_gated_delta_rule_chunked(const GdnDims& shape, const DeltaRuleArgs& args, const GdnSeq* seqs,
                                     int num_seqs, int chunks, float* workspace, cudaStream_t stream) {
  launch_gdn_chunk_prepare(shape, args, seqs, num_seqs, chunks, workspace, stream);
  launch_gdn_chunk_scan(shape, args, seqs, num_seqs, workspace, stream);
}

namespace {

bool vector_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// row_norm<ZC, GATED> over rows of dim: a warp a row (row_norm_warps) where dim is 128, 256 or
// 512 and every row starts 16-byte aligned, else a block a row.
template <bool ZC, bool GATED>
void launch_row_norm(bool overlap, const float* x, int64_t x_stride, const float* z, int64_t rows, int64_t dim,
                     const float* weight, float eps, float* out, int64_t out_stride, cudaStream_t stream) {
  if (rows <= 0) return;
  const bool vectors = (dim == 128 || dim == 256 || dim == 512) && x_stride % 4 == 0 && out_stride % 4 == 0 &&
                       vector_aligned(x) && vector_aligned(out) && vector_aligned(weight) &&
                       (!GATED || vector_aligned(z));
  if (!vectors) {
    launch_overlapped(overlap, dim3(static_cast<unsigned int>(rows)), dim3(norm_threads(dim)), 0, stream,
                      kernels::row_norm<ZC, GATED>, x, x_stride, z, dim, weight, eps, out, out_stride);
    return;
  }
  constexpr int kWarps = 4;
  const dim3 grid(static_cast<unsigned int>((rows + kWarps - 1) / kWarps)), block(32 * kWarps);
  if (dim == 128)
    launch_overlapped(overlap, grid, block, 0, stream, kernels::row_norm_warps<ZC, GATED, 1>, x, x_stride, z, rows,
                      weight, eps, out, out_stride);
  else if (dim == 256)
    launch_overlapped(overlap, grid, block, 0, stream, kernels::row_norm_warps<ZC, GATED, 2>, x, x_stride, z, rows,
                      weight, eps, out, out_stride);
  else
    launch_overlapped(overlap, grid, block, 0, stream, kernels::row_norm_warps<ZC, GATED, 4>, x, x_stride, z, rows,
                      weight, eps, out, out_stride);
}

}  // namespace

void launch_gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, const float* weight, float eps,
                          float* out, cudaStream_t stream, bool overlap) {
  launch_row_norm<false, true>(overlap, x, dim, z, rows, dim, weight, eps, out, dim, stream);
}

bool head_rms_norm_fits(int64_t dim) { return dim == 128 || dim == 256 || dim == 512; }

void launch_head_rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out,
                          cudaStream_t stream, bool overlap) {
  launch_row_norm<false, false>(overlap, x, dim, nullptr, rows, dim, weight, eps, out, dim, stream);
}

void launch_rmsnorm_zero_centered(const float* x, int64_t x_stride, int64_t rows, int64_t dim, const float* weight,
                                  float eps, float* out, int64_t out_stride, cudaStream_t stream) {
  launch_row_norm<true, false>(false, x, x_stride, nullptr, rows, dim, weight, eps, out, out_stride, stream);
}

void launch_split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim, float* query,
                             float* gate, cudaStream_t stream) {
  const int64_t total = tokens * heads * head_dim;
  if (total <= 0) return;
  kernels::split_query_gate<<<blocks_of(total), kThreads, 0, stream>>>(q_proj_out, total, head_dim, query, gate);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_sigmoid_gate_multiply(float* x, const float* gate, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  kernels::sigmoid_gate_multiply<<<std::min<unsigned int>(blocks_of(count), 132 * 16), kThreads, 0, stream>>>(
      x, gate, count);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_moe_route_softmax_topk(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                                   bool renormalize, int32_t* expert_ids, float* weights, cudaStream_t stream) {
  if (tokens <= 0) return;
  if (experts <= 0 || experts > 512 || top_k <= 0 || top_k > 16 || top_k > experts)
    throw std::invalid_argument("moe routing (CUDA): needs 1 <= top_k <= min(16, experts) and experts <= 512");
  constexpr int kWarps = 4;
  const unsigned int blocks = blocks_of(tokens, kWarps);
  const int e = static_cast<int>(experts), k = static_cast<int>(top_k);
  if (experts <= 64)
    kernels::moe_route_softmax_topk<2><<<blocks, kWarps * 32, 0, stream>>>(logits, tokens, e, k, renormalize,
                                                                          expert_ids, weights);
  else if (experts <= 128)
    kernels::moe_route_softmax_topk<4><<<blocks, kWarps * 32, 0, stream>>>(logits, tokens, e, k, renormalize,
                                                                          expert_ids, weights);
  else if (experts <= 256)
    kernels::moe_route_softmax_topk<8><<<blocks, kWarps * 32, 0, stream>>>(logits, tokens, e, k, renormalize,
                                                                          expert_ids, weights);
  else
    kernels::moe_route_softmax_topk<16><<<blocks, kWarps * 32, 0, stream>>>(logits, tokens, e, k, renormalize,
                                                                           expert_ids, weights);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const float* rows, int64_t hidden, const int32_t* row_of, const float* weights, int64_t tokens,
                        int64_t top_k, float* out, cudaStream_t stream) {
  if (tokens * hidden <= 0) return;
  kernels::moe_combine<<<blocks_of(tokens * hidden), kThreads, 0, stream>>>(rows, hidden, row_of, weights, tokens,
                                                                           static_cast<int>(top_k), out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_moe_add_gated_shared(const float* shared, const float* gate_logit, int64_t tokens, int64_t hidden,
                                 float* out, cudaStream_t stream) {
  if (tokens * hidden <= 0) return;
  kernels::moe_add_gated_shared<<<blocks_of(tokens * hidden), kThreads, 0, stream>>>(shared, gate_logit, tokens,
                                                                                     hidden, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_moe_gemv(const uint16_t* w, int64_t expert_rows, int64_t rows_out, int64_t k, const int32_t* ids,
                     int64_t pairs, int64_t top_k, const float* x, bool x_per_pair, float* y, cudaStream_t stream) {
  if (pairs <= 0 || rows_out <= 0) return;
  if (k % 8 != 0 || k > 12288 || pairs > 65535)
    throw std::invalid_argument("moe_gemv: needs k % 8 == 0, k <= 12288 and at most 65535 pairs");
  const dim3 grid(blocks_of(rows_out, kernels::kMoeGemvWarps), static_cast<unsigned int>(pairs));
  kernels::moe_gemv<<<grid, kernels::kMoeGemvWarps * 32, static_cast<size_t>(k) * sizeof(float), stream>>>(
      w, expert_rows, static_cast<int>(rows_out), static_cast<int>(k), ids, static_cast<int>(top_k), x, x_per_pair, y);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_swiglu_halves(const float* in, int64_t rows, int64_t ff, float* out, cudaStream_t stream) {
  if (rows * ff <= 0) return;
  kernels::swiglu_halves<<<blocks_of(rows * ff), kThreads, 0, stream>>>(in, rows, ff, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_concat_columns(const float* a, int64_t a_cols, const float* b, int64_t b_cols, int64_t rows, float* out,
                           cudaStream_t stream) {
  const int64_t total = rows * (a_cols + b_cols);
  if (total <= 0) return;
  kernels::concat_columns<<<blocks_of(total), kThreads, 0, stream>>>(a, a_cols, b, b_cols, rows, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
