#include "backends/cpu/gdn_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

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
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
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

// One value head of the chunked form over all chunks of the sequence.
class ChunkedHead {
 public:
  ChunkedHead(const GdnDims& dims, int64_t chunk)
      : dims_(dims), chunk_(chunk), cum_(chunk), decay_(chunk * chunk), kk_(chunk * chunk),
        qk_(chunk * chunk), tail_(chunk), u_(chunk * dims.value_dim), w_(chunk * dims.key_dim) {}

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
    for (int64_t r = 0; r < len; ++r) {
      float* vp = &u_[r * dv];
      const float* w = &w_[r * dk];
      for (int64_t i = 0; i < dk; ++i) axpy(-w[i], state + i * dv, vp, dv);
    }
    // O_r = exp(G_r) q_r S_in + Σ_{s<=r} (q_r·k_s) exp(G_r - G_s) V'_s.
    for (int64_t r = 0; r < len; ++r) {
      float* o = io.out + (start + r) * io.out_stride + h * dv;
      const float* q = q_row(io, start + r, kh);
      std::fill(o, o + dv, 0.0f);
      for (int64_t i = 0; i < dk; ++i) axpy(q[i], state + i * dv, o, dv);
      const float inter = std::exp(cum_[r]);
      for (int64_t j = 0; j < dv; ++j) o[j] *= inter;
      for (int64_t s = 0; s <= r; ++s)
        axpy(qk_[r * chunk_ + s] * decay_[r * chunk_ + s], &u_[s * dv], o, dv);
    }
    // S_out = exp(G_last) S_in + Σ_r exp(G_last - G_r) k_r ⊗ V'_r.
    const float last = cum_[len - 1];
    const float chunk_decay = std::exp(last);
    for (int64_t r = 0; r < len; ++r) tail_[r] = std::exp(last - cum_[r]);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = state + i * dv;
      for (int64_t j = 0; j < dv; ++j) row[j] *= chunk_decay;
      for (int64_t r = 0; r < len; ++r)
        axpy(k_row(io, start + r, kh)[i] * tail_[r], &u_[r * dv], row, dv);
    }
  }

  const GdnDims& dims_;
  int64_t chunk_;
  std::vector<float> cum_, decay_, kk_, qk_, tail_, u_, w_;
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
  require(kernel >= 1, "causal_conv1d_silu: kernel must be >= 1");
  require(channels > 0 && tokens >= 0, "causal_conv1d_silu: channels must be > 0, tokens >= 0");
  require(x_stride >= channels && out_stride >= channels,
          "causal_conv1d_silu: row strides must be >= channels");
  require(x && weight && out && (conv_state || kernel == 1),
          "causal_conv1d_silu: null pointer argument");
  const int64_t history = kernel - 1;
  constexpr int64_t kBlock = 64;  // channels per work item; the window stays in L1
  run_range(parallel, (channels + kBlock - 1) / kBlock, [&](int64_t first, int64_t last) {
    std::vector<float> window(history * kBlock);
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t c0 = blk * kBlock, n = std::min(kBlock, channels - c0);
      for (int64_t j = 0; j < history; ++j)
        std::memcpy(&window[j * kBlock], conv_state + j * channels + c0, n * sizeof(float));
      for (int64_t t = 0; t < tokens; ++t) {
        const float* in = x + t * x_stride + c0;
        float* o = out + t * out_stride + c0;
        for (int64_t c = 0; c < n; ++c) {
          const float* wc = weight + (c0 + c) * kernel;
          const float current = in[c];  // read before o[c] is written: out may alias x
          float acc = wc[history] * current;
          for (int64_t j = 0; j < history; ++j) acc += wc[j] * window[j * kBlock + c];
          for (int64_t j = 0; j + 1 < history; ++j)
            window[j * kBlock + c] = window[(j + 1) * kBlock + c];
          if (history > 0) window[(history - 1) * kBlock + c] = current;
          o[c] = silu(acc);
        }
      }
      for (int64_t j = 0; j < history; ++j)
        std::memcpy(conv_state + j * channels + c0, &window[j * kBlock], n * sizeof(float));
    }
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
  const int64_t hv = dims.value_heads, dk = dims.key_dim, dv = dims.value_dim;
  const int64_t ratio = hv / dims.key_heads, head_floats = dk * dv;
  run_range(parallel, hv, [&](int64_t first, int64_t last) {
    std::vector<float> delta(dv);
    for (int64_t h = first; h < last; ++h) {
      float* s = state + h * head_floats;
      const int64_t kh = h / ratio;
      for (int64_t t = 0; t < tokens; ++t) {
        const float* q = io.q + t * io.qk_stride + kh * dk;
        const float* k = io.k + t * io.qk_stride + kh * dk;
        const float* v = io.v + t * io.v_stride + h * dv;
        float* o = io.out + t * io.out_stride + h * dv;
        const float decay = std::exp(io.g[t * hv + h]);
        const float beta = io.beta[t * hv + h];
        // Memory read from the decayed state: (decay·S)ᵀ k.
        std::fill(delta.begin(), delta.end(), 0.0f);
        for (int64_t i = 0; i < dk; ++i) axpy(k[i], s + i * dv, delta.data(), dv);
        for (int64_t j = 0; j < dv; ++j) delta[j] = beta * (v[j] - decay * delta[j]);
        // Decay, write k ⊗ δ, and read the output from the updated state.
        std::fill(o, o + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i) {
          float* row = s + i * dv;
          for (int64_t j = 0; j < dv; ++j) row[j] = decay * row[j] + k[i] * delta[j];
          axpy(q[i], row, o, dv);
        }
        if (state_history != nullptr)
          std::memcpy(state_history + (t * hv + h) * head_floats, s, head_floats * sizeof(float));
      }
    }
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

void gdn_mixer_core(const GdnLayerParams& layer, int64_t tokens, float* mixed, const float* z,
                    const float* b, const float* a, float* conv_state, float* ssm_state,
                    float* out, DeltaRuleForm form, const ParallelRange* parallel) {
  const GdnDims& dims = layer.dims;
  dims.validate();
  require(tokens >= 0, "gdn_mixer_core: tokens must be >= 0");
  if (tokens == 0) return;
  require(mixed && z && b && a && ssm_state && out && layer.conv_weight && layer.A_log &&
              layer.dt_bias && layer.norm_weight,
          "gdn_mixer_core: null pointer argument");
  const int64_t channels = dims.conv_channels(), hv = dims.value_heads;
  causal_conv1d_silu(mixed, channels, tokens, channels, layer.conv_weight, layer.conv_kernel,
                     conv_state, mixed, channels, parallel);
  float* q = mixed;
  float* k = mixed + dims.key_width();
  const float* v = mixed + 2 * dims.key_width();
  l2norm_heads(q, channels, tokens, dims.key_heads, dims.key_dim,
               1.0f / std::sqrt(static_cast<float>(dims.key_dim)));
  l2norm_heads(k, channels, tokens, dims.key_heads, dims.key_dim, 1.0f);
  std::vector<float> beta(tokens * hv), g(tokens * hv);
  gdn_gates(b, hv, a, hv, tokens, hv, layer.A_log, layer.dt_bias, beta.data(), g.data());
  const DeltaRuleIo io{q, k, channels, v, channels, g.data(), beta.data(), out, dims.value_width()};
  const bool chunked =
      form == DeltaRuleForm::Chunked || (form == DeltaRuleForm::Auto && tokens > 1);
  if (chunked) {
    gated_delta_rule_chunked(dims, tokens, io, ssm_state, layer.chunk_size, parallel);
  } else {
    gated_delta_rule_recurrent(dims, tokens, io, ssm_state, nullptr, parallel);
  }
  gated_rmsnorm(out, z, tokens * hv, dims.value_dim, layer.norm_weight, layer.norm_eps, out);
}

}  // namespace ninfer::cpu
