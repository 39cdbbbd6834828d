#include "backends/cpu/gdn_cpu.h"

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

// The inner loops get an AVX2/FMA clone picked at load time (GCC/Clang ifunc) on x86-64; the
// rest of the core is built for the baseline ISA.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NINFER_VECTOR_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define NINFER_VECTOR_CLONES
#endif

namespace ninfer::cpu {
namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus with beta 1 and threshold 20.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Dot product with independent partial sums, so the loop vectorises without -ffast-math.
NINFER_VECTOR_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

NINFER_VECTOR_CLONES void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// One state row of a recurrent step: row ← decay·row + k_i·δ, then o += q_i·row.
NINFER_VECTOR_CLONES void decay_write_read(float* row, float decay, float k_i, const float* delta,
                                           float q_i, float* o, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float updated = decay * row[j] + k_i * delta[j];
    row[j] = updated;
    o[j] += q_i * updated;
  }
}

// C[m, n] += alpha · A[m, k] · B[k, n] (row strides lda, ldb, ldc), portable version: four rows
// of C at a time so each row of B is loaded once per four output rows.
void gemm_accumulate_portable(int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                              int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) {
    float* c0 = C + r * ldc;
    float* c1 = c0 + ldc;
    float* c2 = c1 + ldc;
    float* c3 = c2 + ldc;
    const float* a = A + r * lda;
    for (int64_t p = 0; p < k; ++p) {
      const float a0 = alpha * a[p], a1 = alpha * a[lda + p];
      const float a2 = alpha * a[2 * lda + p], a3 = alpha * a[3 * lda + p];
      const float* b = B + p * ldb;
      for (int64_t j = 0; j < n; ++j) {
        const float bj = b[j];
        c0[j] += a0 * bj;
        c1[j] += a1 * bj;
        c2[j] += a2 * bj;
        c3[j] += a3 * bj;
      }
    }
  }
  for (; r < m; ++r)
    for (int64_t p = 0; p < k; ++p) axpy(alpha * A[r * lda + p], B + p * ldb, C + r * ldc, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2/FMA version: 4 × 16 blocks of C live in eight registers across the whole k loop.
__attribute__((target("avx2,fma"))) void gemm_accumulate_avx2(int64_t m, int64_t n, int64_t k,
                                                              float alpha, const float* A,
                                                              int64_t lda, const float* B,
                                                              int64_t ldb, float* C, int64_t ldc) {
  const int64_t full_rows = m - m % 4, full_cols = n - n % 16;
  for (int64_t r = 0; r < full_rows; r += 4) {
    for (int64_t c = 0; c < full_cols; c += 16) {
      __m256 acc[4][2];
      for (auto& row : acc) row[0] = row[1] = _mm256_setzero_ps();
      for (int64_t p = 0; p < k; ++p) {
        const __m256 b0 = _mm256_loadu_ps(B + p * ldb + c);
        const __m256 b1 = _mm256_loadu_ps(B + p * ldb + c + 8);
        for (int i = 0; i < 4; ++i) {
          const __m256 a = _mm256_broadcast_ss(A + (r + i) * lda + p);
          acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
      }
      const __m256 scale = _mm256_set1_ps(alpha);
      for (int i = 0; i < 4; ++i) {
        float* out = C + (r + i) * ldc + c;
        _mm256_storeu_ps(out, _mm256_fmadd_ps(scale, acc[i][0], _mm256_loadu_ps(out)));
        _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(scale, acc[i][1], _mm256_loadu_ps(out + 8)));
      }
    }
  }
  if (full_cols < n)  // leftover columns of the full row blocks
    gemm_accumulate_portable(full_rows, n - full_cols, k, alpha, A, lda, B + full_cols, ldb,
                             C + full_cols, ldc);
  if (full_rows < m)
    gemm_accumulate_portable(m - full_rows, n, k, alpha, A + full_rows * lda, lda, B, ldb,
                             C + full_rows * ldc, ldc);
}

// NINFER_CPU_KERNELS=scalar (as for the dense kernels) forces the portable path for tests.
bool use_avx2_gemm() {
  const char* forced = std::getenv("NINFER_CPU_KERNELS");
  if (forced != nullptr && std::string(forced) == "scalar") return false;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const bool kHaveAvx2 = use_avx2_gemm();
#endif

void gemm_accumulate(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float* C, int64_t ldc) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (kHaveAvx2) return gemm_accumulate_avx2(m, n, k, alpha, A, lda, B, ldb, C, ldc);
#endif
  gemm_accumulate_portable(m, n, k, alpha, A, lda, B, ldb, C, ldc);
}

void validate_io(const GdnDims& dims, int64_t tokens, const DeltaRuleIo& io, const float* state) {
  dims.validate();
  require(tokens >= 0, "gated delta rule: tokens must be >= 0");
  if (tokens == 0) return;
  require(io.q && io.k && io.v && io.g && io.beta && io.out && state,
          "gated delta rule: null input, output or state pointer");
  require(io.qk_stride >= dims.key_width(), "gated delta rule: qk_stride < Hk*dk");
  require(io.v_stride >= dims.value_width(), "gated delta rule: v_stride < Hv*dv");
  require(io.out_stride >= dims.value_width(), "gated delta rule: out_stride < Hv*dv");
}

constexpr int64_t kConvBlock = 64;  // channels per conv work item; the window stays in L1

int64_t conv_blocks(int64_t channels) { return (channels + kConvBlock - 1) / kConvBlock; }

void validate_conv(int64_t x_stride, int64_t tokens, int64_t channels, int64_t kernel,
                   int64_t out_stride) {
  require(kernel >= 1, "causal_conv1d_silu: kernel must be >= 1");
  require(channels > 0 && tokens >= 0, "causal_conv1d_silu: channels must be > 0, tokens >= 0");
  require(x_stride >= channels && out_stride >= channels,
          "causal_conv1d_silu: row strides must be >= channels");
}

// The conv over channel block `blk` for all tokens. window holds (kernel-1) × kConvBlock floats.
void conv_block(const float* x, int64_t x_stride, int64_t tokens, int64_t channels,
                const float* weight, int64_t kernel, float* conv_state, float* out,
                int64_t out_stride, int64_t blk, float* window) {
  const int64_t history = kernel - 1;
  const int64_t c0 = blk * kConvBlock, n = std::min(kConvBlock, channels - c0);
  for (int64_t j = 0; j < history; ++j)
    std::memcpy(&window[j * kConvBlock], conv_state + j * channels + c0, n * sizeof(float));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* in = x + t * x_stride + c0;
    float* o = out + t * out_stride + c0;
    for (int64_t c = 0; c < n; ++c) {
      const float* wc = weight + (c0 + c) * kernel;
      const float current = in[c];  // read before o[c] is written: out may alias x
      float acc = wc[history] * current;
      for (int64_t j = 0; j < history; ++j) acc += wc[j] * window[j * kConvBlock + c];
      for (int64_t j = 0; j + 1 < history; ++j)
        window[j * kConvBlock + c] = window[(j + 1) * kConvBlock + c];
      if (history > 0) window[(history - 1) * kConvBlock + c] = current;
      o[c] = silu(acc);
    }
  }
  for (int64_t j = 0; j < history; ++j)
    std::memcpy(conv_state + j * channels + c0, &window[j * kConvBlock], n * sizeof(float));
}

// One value head of the chunked form over all chunks of the sequence.
class ChunkedHead {
 public:
  ChunkedHead(const GdnDims& dims, int64_t chunk)
      : dims_(dims), chunk_(chunk), cum_(chunk), decay_(chunk * chunk), kk_(chunk * chunk),
        qk_(chunk * chunk), u_(chunk * dims.value_dim), w_(chunk * dims.key_dim) {}

  void run(int64_t head, int64_t tokens, const DeltaRuleIo& io, float* state) {
    for (int64_t start = 0; start < tokens; start += chunk_)
      run_chunk(head, start, std::min(chunk_, tokens - start), io, state);
  }

 private:
  const float* q_row(const DeltaRuleIo& io, int64_t t, int64_t kh) const {
    return io.q + t * io.qk_stride + kh * dims_.key_dim;
  }
  const float* k_row(const DeltaRuleIo& io, int64_t t, int64_t kh) const {
    return io.k + t * io.qk_stride + kh * dims_.key_dim;
  }

  void run_chunk(int64_t h, int64_t start, int64_t len, const DeltaRuleIo& io, float* state) {
    const int64_t hv = dims_.value_heads, dk = dims_.key_dim, dv = dims_.value_dim;
    const int64_t kh = h / (hv / dims_.key_heads);
    // G_r: log decay accumulated from the chunk start through token r.
    float running = 0.0f;
    for (int64_t r = 0; r < len; ++r) {
      running += io.g[(start + r) * hv + h];
      cum_[r] = running;
    }
    // Pairwise decays exp(G_r - G_s) (s <= r), k_r·k_s and q_r·k_s.
    for (int64_t r = 0; r < len; ++r) {
      for (int64_t s = 0; s <= r; ++s) {
        decay_[r * chunk_ + s] = std::exp(cum_[r] - cum_[s]);
        kk_[r * chunk_ + s] = dot(k_row(io, start + r, kh), k_row(io, start + s, kh), dk);
        qk_[r * chunk_ + s] = dot(q_row(io, start + r, kh), k_row(io, start + s, kh), dk);
      }
    }
    // UT transform by forward substitution with A_rs = β_r (k_r·k_s) exp(G_r - G_s), s < r:
    //   U = (I + A)^-1 (β ⊙ V),  W = (I + A)^-1 (β ⊙ exp(G) ⊙ K).
    for (int64_t r = 0; r < len; ++r) {
      const float beta = io.beta[(start + r) * hv + h];
      float* u = &u_[r * dv];
      float* w = &w_[r * dk];
      const float* v = io.v + (start + r) * io.v_stride + h * dv;
      const float* k = k_row(io, start + r, kh);
      const float wk = beta * std::exp(cum_[r]);
      for (int64_t j = 0; j < dv; ++j) u[j] = beta * v[j];
      for (int64_t i = 0; i < dk; ++i) w[i] = wk * k[i];
      for (int64_t s = 0; s < r; ++s) {
        const float a = beta * kk_[r * chunk_ + s] * decay_[r * chunk_ + s];
        axpy(-a, &u_[s * dv], u, dv);
        axpy(-a, &w_[s * dk], w, dk);
      }
    }
    // V' = U - W S_in, stored over U: what the chunk writes beyond what the old state predicts.
    gemm_accumulate(len, dv, dk, -1.0f, w_.data(), dk, state, dv, u_.data(), dv);
    // O = diag(exp(G)) Q S_in + P V' with P_rs = (q_r·k_s) exp(G_r - G_s) for s <= r, else 0.
    float* o = io.out + start * io.out_stride + h * dv;
    for (int64_t r = 0; r < len; ++r) std::fill_n(o + r * io.out_stride, dv, 0.0f);
    gemm_accumulate(len, dv, dk, 1.0f, q_row(io, start, kh), io.qk_stride, state, dv, o,
                    io.out_stride);
    for (int64_t r = 0; r < len; ++r) {
      const float inter = std::exp(cum_[r]);
      for (int64_t j = 0; j < dv; ++j) o[r * io.out_stride + j] *= inter;
      for (int64_t s = 0; s < len; ++s)
        qk_[r * chunk_ + s] = s <= r ? qk_[r * chunk_ + s] * decay_[r * chunk_ + s] : 0.0f;
    }
    gemm_accumulate(len, dv, len, 1.0f, qk_.data(), chunk_, u_.data(), dv, o, io.out_stride);
    // S_out = exp(G_last) S_in + Kdᵀ V' with Kd_r = exp(G_last - G_r) k_r.
    const float last = cum_[len - 1];
    const float chunk_decay = std::exp(last);
    for (int64_t r = 0; r < len; ++r) {
      const float tail = std::exp(last - cum_[r]);
      const float* k = k_row(io, start + r, kh);
      for (int64_t i = 0; i < dk; ++i) w_[i * chunk_ + r] = tail * k[i];  // W is spent: reuse
    }
    for (int64_t i = 0; i < dk * dv; ++i) state[i] *= chunk_decay;
    gemm_accumulate(dk, dv, len, 1.0f, w_.data(), chunk_, u_.data(), dv, state, dv);
  }

  const GdnDims& dims_;
  int64_t chunk_;
  std::vector<float> cum_, decay_, kk_, qk_, u_, w_;  // w_ is [chunk, dk] = [dk, chunk]
};

// One value head of the token-by-token form.
class RecurrentHead {
 public:
  explicit RecurrentHead(const GdnDims& dims) : dims_(dims), delta_(dims.value_dim) {}

  // state is this head's [dk, dv]; history (optional) is the whole [tokens, Hv, dk, dv].
  void run(int64_t h, int64_t tokens, const DeltaRuleIo& io, float* state, float* history) {
    const int64_t hv = dims_.value_heads, dk = dims_.key_dim, dv = dims_.value_dim;
    const int64_t kh = h / (hv / dims_.key_heads), head_floats = dk * dv;
    float* delta = delta_.data();
    for (int64_t t = 0; t < tokens; ++t) {
      const float* q = io.q + t * io.qk_stride + kh * dk;
      const float* k = io.k + t * io.qk_stride + kh * dk;
      const float* v = io.v + t * io.v_stride + h * dv;
      float* o = io.out + t * io.out_stride + h * dv;
      const float decay = std::exp(io.g[t * hv + h]);
      const float beta = io.beta[t * hv + h];
      // Memory read from the decayed state: (decay·S)ᵀ k.
      std::fill(delta, delta + dv, 0.0f);
      for (int64_t i = 0; i < dk; ++i) axpy(k[i], state + i * dv, delta, dv);
      for (int64_t j = 0; j < dv; ++j) delta[j] = beta * (v[j] - decay * delta[j]);
      // Decay, write k ⊗ δ, and read the output from the updated state.
      std::fill(o, o + dv, 0.0f);
      for (int64_t i = 0; i < dk; ++i)
        decay_write_read(state + i * dv, decay, k[i], delta, q[i], o, dv);
      if (history != nullptr)
        std::memcpy(history + (t * hv + h) * head_floats, state, head_floats * sizeof(float));
    }
  }

 private:
  const GdnDims& dims_;
  std::vector<float> delta_;
};

}  // namespace

void GdnDims::validate() const {
  require(key_heads > 0 && value_heads > 0 && key_dim > 0 && value_dim > 0,
          "GDN dims: head counts and head dims must be positive");
  require(value_heads % key_heads == 0,
          "GDN dims: linear_num_value_heads must be a multiple of linear_num_key_heads");
}

void causal_conv1d_silu(const float* x, int64_t x_stride, int64_t tokens, int64_t channels,
                        const float* weight, int64_t kernel, float* conv_state, float* out,
                        int64_t out_stride, const ParallelRange* parallel) {
  validate_conv(x_stride, tokens, channels, kernel, out_stride);
  require(x && weight && out && (conv_state || kernel == 1),
          "causal_conv1d_silu: null pointer argument");
  run_range(parallel, conv_blocks(channels), [&](int64_t first, int64_t last) {
    std::vector<float> window((kernel - 1) * kConvBlock);
    for (int64_t blk = first; blk < last; ++blk)
      conv_block(x, x_stride, tokens, channels, weight, kernel, conv_state, out, out_stride, blk,
                 window.data());
  });
}

void l2norm_heads(float* x, int64_t row_stride, int64_t tokens, int64_t heads, int64_t head_dim,
                  float scale, float eps) {
  require(tokens >= 0 && heads > 0 && head_dim > 0, "l2norm_heads: bad dimensions");
  require(row_stride >= heads * head_dim, "l2norm_heads: row_stride < heads*head_dim");
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      const float factor = scale / std::sqrt(dot(v, v, head_dim) + eps);
      for (int64_t i = 0; i < head_dim; ++i) v[i] *= factor;
    }
  }
}

void gdn_gates(const float* b, int64_t b_stride, const float* a, int64_t a_stride, int64_t tokens,
               int64_t value_heads, const float* A_log, const float* dt_bias, float* beta,
               float* g) {
  require(tokens >= 0 && value_heads > 0, "gdn_gates: bad dimensions");
  require(b_stride >= value_heads && a_stride >= value_heads,
          "gdn_gates: row strides must be >= value_heads");
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < value_heads; ++h) {
      beta[t * value_heads + h] = sigmoid(b[t * b_stride + h]);
      g[t * value_heads + h] = -std::exp(A_log[h]) * softplus(a[t * a_stride + h] + dt_bias[h]);
    }
  }
}

void gated_delta_rule_recurrent(const GdnDims& dims, int64_t tokens, const DeltaRuleIo& io,
                                float* state, float* state_history,
                                const ParallelRange* parallel) {
  validate_io(dims, tokens, io, state);
  const int64_t head_floats = dims.key_dim * dims.value_dim;
  run_range(parallel, dims.value_heads, [&](int64_t first, int64_t last) {
    RecurrentHead worker(dims);
    for (int64_t h = first; h < last; ++h)
      worker.run(h, tokens, io, state + h * head_floats, state_history);
  });
}

void gated_delta_rule_chunked(const GdnDims& dims, int64_t tokens, const DeltaRuleIo& io,
                              float* state, int64_t chunk_size, const ParallelRange* parallel) {
  validate_io(dims, tokens, io, state);
  require(chunk_size >= 1, "gated_delta_rule_chunked: chunk_size must be >= 1");
  if (tokens == 0) return;
  const int64_t head_floats = dims.key_dim * dims.value_dim;
  run_range(parallel, dims.value_heads, [&](int64_t first, int64_t last) {
    ChunkedHead worker(dims, chunk_size);
    for (int64_t h = first; h < last; ++h) worker.run(h, tokens, io, state + h * head_floats);
  });
}

void gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, const float* weight,
                   float eps, float* out) {
  require(rows >= 0 && dim > 0, "gated_rmsnorm: bad dimensions");
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* zr = z + r * dim;
    float* o = out + r * dim;
    const float inv = 1.0f / std::sqrt(dot(xr, xr, dim) / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = weight[i] * (xr[i] * inv) * silu(zr[i]);
  }
}

void gdn_mixer_batch(const GdnLayerParams& layer, std::span<const GdnSequence> sequences,
                     float* mixed, const float* z, const float* b, const float* a, float* out,
                     DeltaRuleForm form, const ParallelRange* parallel) {
  const GdnDims& dims = layer.dims;
  dims.validate();
  require(layer.chunk_size >= 1, "gdn_mixer_batch: chunk_size must be >= 1");
  require(layer.conv_kernel >= 1, "gdn_mixer_batch: conv_kernel must be >= 1");
  int64_t rows = 0;
  for (const auto& seq : sequences) {
    require(seq.row_begin == rows && seq.num_tokens >= 0,
            "gdn_mixer_batch: sequences must tile the rows in order");
    require(seq.ssm_state && (seq.conv_state || layer.conv_kernel == 1),
            "gdn_mixer_batch: null state pointer");
    rows += seq.num_tokens;
  }
  if (rows == 0) return;
  require(mixed && z && b && a && out && layer.conv_weight && layer.A_log && layer.dt_bias &&
              layer.norm_weight,
          "gdn_mixer_batch: null pointer argument");
  const int64_t channels = dims.conv_channels(), hv = dims.value_heads;
  const int64_t num_seqs = static_cast<int64_t>(sequences.size());
  const int64_t blocks = conv_blocks(channels), head_floats = dims.key_dim * dims.value_dim;

  // Conv (in place) over (sequence, channel block) items.
  run_range(parallel, num_seqs * blocks, [&](int64_t first, int64_t last) {
    std::vector<float> window((layer.conv_kernel - 1) * kConvBlock);
    for (int64_t item = first; item < last; ++item) {
      const GdnSequence& seq = sequences[item / blocks];
      float* rows_at = mixed + seq.row_begin * channels;
      conv_block(rows_at, channels, seq.num_tokens, channels, layer.conv_weight,
                 layer.conv_kernel, seq.conv_state, rows_at, channels, item % blocks,
                 window.data());
    }
  });
  // q/k normalisation and the gates, row by row.
  std::vector<float> beta(rows * hv), g(rows * hv);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dims.key_dim));
  run_range(parallel, rows, [&](int64_t first, int64_t last) {
    float* q = mixed + first * channels;
    l2norm_heads(q, channels, last - first, dims.key_heads, dims.key_dim, q_scale);
    l2norm_heads(q + dims.key_width(), channels, last - first, dims.key_heads, dims.key_dim, 1.0f);
    gdn_gates(b + first * hv, hv, a + first * hv, hv, last - first, hv, layer.A_log,
              layer.dt_bias, beta.data() + first * hv, g.data() + first * hv);
  });
  // The delta rule over (sequence, value head) items.
  run_range(parallel, num_seqs * hv, [&](int64_t first, int64_t last) {
    ChunkedHead chunked(dims, layer.chunk_size);
    RecurrentHead recurrent(dims);
    for (int64_t item = first; item < last; ++item) {
      const GdnSequence& seq = sequences[item / hv];
      const int64_t h = item % hv, r0 = seq.row_begin;
      if (seq.num_tokens == 0) continue;
      const float* q = mixed + r0 * channels;
      const DeltaRuleIo io{q, q + dims.key_width(), channels, q + 2 * dims.key_width(), channels,
                           g.data() + r0 * hv, beta.data() + r0 * hv,
                           out + r0 * dims.value_width(), dims.value_width()};
      const bool use_chunked = form == DeltaRuleForm::Chunked ||
                               (form == DeltaRuleForm::Auto && seq.num_tokens > 1);
      float* state = seq.ssm_state + h * head_floats;
      if (use_chunked) {
        chunked.run(h, seq.num_tokens, io, state);
      } else {
        recurrent.run(h, seq.num_tokens, io, state, nullptr);
      }
    }
  });
  run_range(parallel, rows, [&](int64_t first, int64_t last) {
    float* o = out + first * dims.value_width();
    gated_rmsnorm(o, z + first * dims.value_width(), (last - first) * hv, dims.value_dim,
                  layer.norm_weight, layer.norm_eps, o);
  });
}

void gdn_mixer_core(const GdnLayerParams& layer, int64_t tokens, float* mixed, const float* z,
                    const float* b, const float* a, float* conv_state, float* ssm_state,
                    float* out, DeltaRuleForm form, const ParallelRange* parallel) {
  require(tokens >= 0, "gdn_mixer_core: tokens must be >= 0");
  const GdnSequence seq{0, tokens, conv_state, ssm_state};
  gdn_mixer_batch(layer, std::span<const GdnSequence>(&seq, 1), mixed, z, b, a, out, form,
                  parallel);
}

}  // namespace ninfer::cpu
