#include "models/llama.h"

#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "artifact/artifact.h"
#include "backends/backend.h"
#include "cache/kv_pool.h"
#include "models/rope.h"
#include "models/weight_statistics.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tensor_slices.h"

namespace ninfer {

namespace {

struct LlamaConfig {
  int64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  int64_t max_positions = 0;
  float eps = 1e-6f;
  bool qk_norm = false;
};

int64_t required_int(const json::Value& config, const char* key) {
  const json::Value& v = config[key];
  if (!v.is_number() || v.as_int() <= 0)
    throw std::runtime_error(std::string("config: '") + key + "' must be a positive integer");
  return v.as_int();
}

LlamaConfig read_config(const Artifact& artifact) {
  const json::Value& c = artifact.config();
  LlamaConfig cfg;
  cfg.hidden = required_int(c, "hidden_size");
  cfg.intermediate = required_int(c, "intermediate_size");
  cfg.layers = required_int(c, "num_hidden_layers");
  cfg.heads = required_int(c, "num_attention_heads");
  cfg.kv_heads = c["num_key_value_heads"].is_number() ? required_int(c, "num_key_value_heads") : cfg.heads;
  cfg.head_dim = c["head_dim"].is_number() ? required_int(c, "head_dim") : cfg.hidden / cfg.heads;
  cfg.vocab = required_int(c, "vocab_size");
  cfg.max_positions = c.get_int("max_position_embeddings", 0);
  cfg.eps = static_cast<float>(c.get_double("rms_norm_eps", 1e-6));
  cfg.qk_norm = c.get_bool("qk_norm", artifact.architecture() == "qwen3");
  if (cfg.heads % cfg.kv_heads != 0)
    throw std::runtime_error("config: num_attention_heads must be a multiple of num_key_value_heads");
  return cfg;
}

// One tensor-parallel rank's share of the dimensions the group splits (query and KV heads,
// MLP columns); the vocabulary stays whole here (the LM head splits it when it divides).
LlamaConfig rank_config(LlamaConfig cfg, const TensorParallelRank* tp) {
  if (!tp || !tp->active()) return cfg;
  cfg.kv_heads = tp->kv_heads(cfg.heads, cfg.kv_heads);
  cfg.heads = tp->share(cfg.heads, "num_attention_heads");
  cfg.intermediate = tp->share(cfg.intermediate, "intermediate_size");
  return cfg;
}

ModelInfo describe(const Artifact& artifact, const LlamaConfig& cfg) {
  ModelInfo info;
  info.architecture = artifact.architecture();
  info.vocab_size = cfg.vocab;
  info.hidden_size = cfg.hidden;
  info.num_layers = cfg.layers;
  info.num_kv_layers = cfg.layers;
  info.num_kv_heads = cfg.kv_heads;
  info.head_dim = cfg.head_dim;
  info.max_position_embeddings = cfg.max_positions;
  add_weight_statistics(artifact, info);
  return info;
}

class LlamaModel final : public Model {
 public:
  LlamaModel(const Artifact& artifact, KvPool& kv, const ModelOptions& options)
      : cfg_(rank_config(read_config(artifact), options.tensor_parallel)), full_(read_config(artifact)),
        info_(describe(artifact, full_)), rope_(artifact.config()), kv_(kv), options_(options), artifact_(artifact),
        tp_(options.tensor_parallel ? *options.tensor_parallel : TensorParallelRank{}) {
    if (options.max_batch_tokens <= 0 || options.max_lanes <= 0)
      throw std::runtime_error("max_batch_tokens and max_lanes must be positive");
    if (kv.num_layers() != cfg_.layers || kv.num_kv_heads() != cfg_.kv_heads || kv.head_dim() != cfg_.head_dim)
      throw std::runtime_error("the KV pool's geometry does not match the model (use kv_geometry)");
    backend_ = make_backend(options.device, options.threads);
    load_weights();
    allocate_activations();
    // Last: with --kv-capacity auto the pool takes what the weights and workspaces leave.
    backend_->bind_kv(kv_);
    if (!rope_.depends_on_length()) rope_table_ = rope_.table(cfg_.max_positions);
  }

  const ModelInfo& info() const override { return info_; }
  void forward(const BatchPlan& plan, float* logits) override;
  bool samples_on_device() const override { return backend_->samples_on_device(); }
  void forward_sampled(const BatchPlan& plan, const SamplingBatch& sampling, int32_t* ids) override;
  void kv_page_io(int32_t page, void* host, bool to_host) override { backend_->kv_page_io(kv_, page, host, to_host); }

 private:
  struct Layer {
    Buffer input_norm, post_norm, q_norm, k_norm;
    Buffer q_bias, k_bias, v_bias, o_bias;
    Weight q, k, v, o, gate, up, down;
  };

  bool random_weights() const { return options_.random_weights_seed >= 0; }

  // `rows` x `cols` is the tensor's whole shape; `part` is what this rank keeps of it.
  Weight matrix(const std::string& name, int64_t rows, int64_t cols, const TensorPart& part = {}) {
    if (random_weights()) {
      // Uniform in [-a, a] with a = sqrt(3 / cols): unit-variance outputs for unit-RMS inputs.
      const uint64_t seed = std::hash<std::string>{}(name) ^ static_cast<uint64_t>(options_.random_weights_seed);
      const Weight w = backend_->random_weight(part.kept_rows(rows), part.kept_columns(cols), seed,
                                               std::sqrt(3.0f / static_cast<float>(cols)));
      add_random_weight_statistics(info_, w);
      return w;
    }
    const TensorView& t = artifact_.tensor(name);
    if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
      throw std::runtime_error("tensor '" + name + "' should have shape [" + std::to_string(rows) + ", " +
                               std::to_string(cols) + "]");
    return backend_->upload_weight(part.select(slices_, t));
  }
  Buffer vector(const std::string& name, int64_t size, bool required = true, const TensorPart& part = {}) {
    if (random_weights()) {  // norm weights are 1, optional tensors (biases) absent
      if (!required) return {};
      add_random_weight_statistics(info_, DType::F32, 1, size);
      Buffer ones = backend_->alloc(size);
      const std::vector<float> host(static_cast<size_t>(size), 1.0f);
      backend_->copy_from_host(ones.data(), host.data(), size);
      return ones;
    }
    const TensorView* t = artifact_.find(name);
    if (!t) {
      if (required) throw std::runtime_error("artifact lacks tensor '" + name + "'");
      return {};
    }
    if (t->shape.size() != 1 || t->shape[0] != size)
      throw std::runtime_error("tensor '" + name + "' should have shape [" + std::to_string(size) + "]");
    return backend_->upload_vector(part.select(slices_, *t));
  }

  void load_weights();
  void allocate_activations();
  void check_plan(const BatchPlan& plan) const;
  // Enqueues the step; its logits stay in logits_ (backend memory). Returns their row count.
  int64_t enqueue_step(const BatchPlan& plan);
  void apply_rope(float* x, int64_t heads, const std::vector<int32_t>& positions,
                  const std::vector<AttentionSlice>& slices);
  // --- tensor parallelism (a no-op without it) ---
  // This rank's rows [begin, begin + count) or columns of a weight; all of it without TP.
  TensorPart rows_part(int64_t begin, int64_t count) const {
    return tp_.active() ? TensorPart::row_range(begin, count) : TensorPart::all();
  }
  TensorPart columns_part(int64_t begin, int64_t count) const {
    return tp_.active() ? TensorPart::column_range(begin, count) : TensorPart::all();
  }
  // A row-parallel projection leaves each rank a partial sum; the all-reduce completes it.
  void reduce_partial_sums(float* x, int64_t n) {
    if (!tp_.active()) return;
    backend_->synchronize();
    tp_.collective->all_reduce_sum(x, n);
  }
  // Vocabulary-parallel logits [rows, vocab / size] of every rank → logits_ [rows, vocab].
  void gather_vocabulary(int64_t rows);

  LlamaConfig cfg_;   // this rank's dimensions (the whole model's without tensor parallelism)
  LlamaConfig full_;  // the whole model's
  ModelInfo info_;
  RopeScaling rope_;
  RopeTable rope_table_;
  KvPool& kv_;
  ModelOptions options_;
  const Artifact& artifact_;
  TensorParallelRank tp_;
  TensorSlices slices_;          // this rank's parts of split tensors (tensor parallelism)
  bool vocab_parallel_ = false;  // the LM head holds vocab / size rows of this rank
  std::unique_ptr<Backend> backend_;

  Weight embed_, lm_head_;
  Buffer final_norm_;
  std::vector<Layer> layers_;
  Buffer hidden_, normed_, q_, k_, v_, attn_, gate_, up_, logit_inputs_, logits_;
  Buffer rank_logits_, gathered_logits_;  // vocabulary-parallel LM head
  std::vector<int32_t> vocab_order_;      // gathered_logits_ row of each logits_ row part
};

void LlamaModel::load_weights() {
  const int64_t h = cfg_.hidden, hd = cfg_.head_dim, qd = cfg_.heads * hd, kvd = cfg_.kv_heads * hd;
  // Tensor parallelism (Megatron): q/k/v and gate/up keep this rank's heads / MLP rows, o and
  // down the matching columns; the LM head this rank's slice of the vocabulary.
  const int64_t full_qd = full_.heads * hd, full_kvd = full_.kv_heads * hd, ff = cfg_.intermediate;
  const TensorPart q_rows = rows_part(tp_.rank * qd, qd), o_columns = columns_part(tp_.rank * qd, qd);
  const TensorPart kv_rows = rows_part(tp_.first_kv_head(full_.heads, full_.kv_heads) * hd, kvd);
  const TensorPart ff_rows = rows_part(tp_.rank * ff, ff), ff_columns = columns_part(tp_.rank * ff, ff);
  vocab_parallel_ = tp_.active() && cfg_.vocab % tp_.size == 0;
  const int64_t vocab_share = vocab_parallel_ ? cfg_.vocab / tp_.size : cfg_.vocab;
  const TensorPart vocab_rows = rows_part(tp_.rank * vocab_share, vocab_share);
  embed_ = matrix("model.embed_tokens.weight", cfg_.vocab, h);
  const bool untied = random_weights() ? !artifact_.config().get_bool("tie_word_embeddings", false)
                                       : artifact_.find("lm_head.weight") != nullptr;
  if (untied) lm_head_ = matrix("lm_head.weight", cfg_.vocab, h, vocab_parallel_ ? vocab_rows : TensorPart::all());
  else lm_head_ = vocab_parallel_ ? matrix("model.embed_tokens.weight", cfg_.vocab, h, vocab_rows) : embed_;
  final_norm_ = vector("model.norm.weight", h);
  layers_.resize(static_cast<size_t>(cfg_.layers));
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& L = layers_[static_cast<size_t>(i)];
    L.input_norm = vector(p + "input_layernorm.weight", h);
    L.post_norm = vector(p + "post_attention_layernorm.weight", h);
    L.q = matrix(p + "self_attn.q_proj.weight", full_qd, h, q_rows);
    L.k = matrix(p + "self_attn.k_proj.weight", full_kvd, h, kv_rows);
    L.v = matrix(p + "self_attn.v_proj.weight", full_kvd, h, kv_rows);
    L.o = matrix(p + "self_attn.o_proj.weight", h, full_qd, o_columns);
    // Biases are used wherever the checkpoint has them (Qwen2: q/k/v; Llama attention_bias: also o).
    L.q_bias = vector(p + "self_attn.q_proj.bias", full_qd, false, q_rows);
    L.k_bias = vector(p + "self_attn.k_proj.bias", full_kvd, false, kv_rows);
    L.v_bias = vector(p + "self_attn.v_proj.bias", full_kvd, false, kv_rows);
    // added once, by rank 0, to the partial sums the all-reduce completes
    if (tp_.rank == 0) L.o_bias = vector(p + "self_attn.o_proj.bias", h, false);
    if (cfg_.qk_norm) {
      L.q_norm = vector(p + "self_attn.q_norm.weight", cfg_.head_dim);
      L.k_norm = vector(p + "self_attn.k_norm.weight", cfg_.head_dim);
    }
    L.gate = matrix(p + "mlp.gate_proj.weight", full_.intermediate, h, ff_rows);
    L.up = matrix(p + "mlp.up_proj.weight", full_.intermediate, h, ff_rows);
    L.down = matrix(p + "mlp.down_proj.weight", h, full_.intermediate, ff_columns);
  }
}

void LlamaModel::allocate_activations() {
  const int64_t t = options_.max_batch_tokens;
  hidden_ = backend_->alloc(t * cfg_.hidden);
  normed_ = backend_->alloc(t * cfg_.hidden);
  q_ = backend_->alloc(t * cfg_.heads * cfg_.head_dim);
  k_ = backend_->alloc(t * cfg_.kv_heads * cfg_.head_dim);
  v_ = backend_->alloc(t * cfg_.kv_heads * cfg_.head_dim);
  attn_ = backend_->alloc(t * cfg_.heads * cfg_.head_dim);
  gate_ = backend_->alloc(t * cfg_.intermediate);
  up_ = backend_->alloc(t * cfg_.intermediate);
}

void LlamaModel::check_plan(const BatchPlan& plan) const {
  if (plan.hidden_out) throw std::invalid_argument("the " + info_.architecture + " model has no draft head (hidden_out)");
  int64_t total = 0;
  for (const auto& s : plan.slices) {
    if (s.lane < 0 || s.lane >= options_.max_lanes)
      throw std::invalid_argument("slice lane " + std::to_string(s.lane) + " is outside [0, " +
                                  std::to_string(options_.max_lanes) + ")");
    if (s.num_tokens <= 0 || s.start_pos < 0)
      throw std::invalid_argument("a slice needs at least one token and a non-negative start position");
    if (!s.page_table && s.num_pages > 0) throw std::invalid_argument("slice has pages but no page table");
    total += s.num_tokens;
  }
  if (total != static_cast<int64_t>(plan.tokens.size()))
    throw std::invalid_argument("plan slices cover " + std::to_string(total) + " tokens but the plan holds " +
                                std::to_string(plan.tokens.size()));
  if (total > options_.max_batch_tokens)
    throw std::invalid_argument("plan of " + std::to_string(total) + " tokens exceeds max_batch_tokens " +
                                std::to_string(options_.max_batch_tokens));
}

void LlamaModel::apply_rope(float* x, int64_t heads, const std::vector<int32_t>& positions,
                            const std::vector<AttentionSlice>& slices) {
  if (!rope_.depends_on_length()) {
    backend_->rope(x, heads, cfg_.head_dim, rope_.rotary_dim(), positions, rope_table_.inv_freq,
                   rope_table_.attention_factor);
    return;
  }
  // Dynamic scaling: each sequence uses the table for its own length, as HF does per call.
  for (const auto& s : slices) {
    const RopeTable table = rope_.table(static_cast<int64_t>(s.start_pos) + s.num_tokens);
    backend_->rope(x + static_cast<int64_t>(s.row_begin) * heads * cfg_.head_dim, heads, cfg_.head_dim,
                   rope_.rotary_dim(), std::span(positions).subspan(static_cast<size_t>(s.row_begin), s.num_tokens),
                   table.inv_freq, table.attention_factor);
  }
}

void LlamaModel::forward(const BatchPlan& plan, float* logits) {
  const int64_t rows = enqueue_step(plan);
  if (rows == 0) return;
  backend_->synchronize();
  backend_->copy_to_host(logits, logits_.data(), rows * cfg_.vocab);
}

void LlamaModel::forward_sampled(const BatchPlan& plan, const SamplingBatch& sampling, int32_t* ids) {
  check_sampling_rows(plan, sampling);
  const int64_t rows = enqueue_step(plan);
  if (rows == 0) return;
  backend_->sample_rows(logits_.data(), cfg_.vocab, sampling, ids);
}

int64_t LlamaModel::enqueue_step(const BatchPlan& plan) {
  check_plan(plan);
  const int64_t t = static_cast<int64_t>(plan.tokens.size());
  if (t == 0) return 0;
  const int64_t h = cfg_.hidden, hd = cfg_.head_dim;
  std::vector<int32_t> positions(static_cast<size_t>(t));
  std::vector<AttentionSlice> slices;
  std::vector<int32_t> logit_rows;
  int32_t row = 0;
  for (const auto& s : plan.slices) {
    slices.push_back({row, s.num_tokens, s.start_pos, s.page_table, s.num_pages});
    for (int32_t i = 0; i < s.num_tokens; ++i) positions[static_cast<size_t>(row + i)] = s.start_pos + i;
    for (int32_t i = s.num_tokens - s.logit_rows(); i < s.num_tokens; ++i) logit_rows.push_back(row + i);
    row += s.num_tokens;
  }
  const AttentionShape shape{cfg_.heads, cfg_.kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  Backend& b = *backend_;
  float *hidden = hidden_.data(), *normed = normed_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data();
  float *attn = attn_.data(), *gate = gate_.data(), *up = up_.data();

  const auto rows = static_cast<int64_t>(logit_rows.size());
  if (logits_.size() < rows * cfg_.vocab) {  // before run_step: a step's ops must not allocate
    logit_inputs_ = b.alloc(rows * h);
    logits_ = b.alloc(rows * cfg_.vocab);
    if (vocab_parallel_) {
      rank_logits_ = b.alloc(rows * cfg_.vocab / tp_.size);
      gathered_logits_ = b.alloc(rows * cfg_.vocab);
    }
  }
  b.run_step(plan.single_token_slices(), [&] {
    b.embedding(embed_, plan.tokens, hidden);
    for (int64_t li = 0; li < cfg_.layers; ++li) {
      const Layer& L = layers_[static_cast<size_t>(li)];
      b.rms_norm(hidden, t, h, L.input_norm.data(), cfg_.eps, normed);
      const MatmulOutput qkv[] = {{&L.q, L.q_bias.data(), q}, {&L.k, L.k_bias.data(), k}, {&L.v, L.v_bias.data(), v}};
      b.matmul_many(normed, t, qkv);
      if (cfg_.qk_norm) {
        b.head_rms_norm(q, t * cfg_.heads, hd, L.q_norm.data(), cfg_.eps, q);
        b.head_rms_norm(k, t * cfg_.kv_heads, hd, L.k_norm.data(), cfg_.eps, k);
      }
      apply_rope(q, cfg_.heads, positions, slices);
      apply_rope(k, cfg_.kv_heads, positions, slices);
      b.kv_write(kv_, li, k, v, slices);
      b.attention(kv_, li, q, slices, shape, attn);
      b.matmul(attn, t, L.o, L.o_bias.data(), normed);
      reduce_partial_sums(normed, t * h);
      b.add(hidden, normed, t * h);
      b.rms_norm(hidden, t, h, L.post_norm.data(), cfg_.eps, normed);
      const MatmulOutput gate_up[] = {{&L.gate, nullptr, gate}, {&L.up, nullptr, up}};
      b.matmul_many(normed, t, gate_up);
      b.swiglu_matmul(gate, up, t, L.down, normed);
      reduce_partial_sums(normed, t * h);
      b.add(hidden, normed, t * h);
    }

    if (rows == 0) return;
    b.gather_rows(hidden, h, logit_rows, logit_inputs_.data());
    b.rms_norm(logit_inputs_.data(), rows, h, final_norm_.data(), cfg_.eps, logit_inputs_.data());
    if (!vocab_parallel_) return b.matmul(logit_inputs_.data(), rows, lm_head_, nullptr, logits_.data());
    b.matmul(logit_inputs_.data(), rows, lm_head_, nullptr, rank_logits_.data());
    gather_vocabulary(rows);
  });
  return rows;
}

void LlamaModel::gather_vocabulary(int64_t rows) {
  const int64_t share = cfg_.vocab / tp_.size;
  backend_->synchronize();
  tp_.collective->all_gather(rank_logits_.data(), rows * share, gathered_logits_.data());
  // gathered [rank, row, share] → logits [row, rank, share]: row (r, k) is gathered row k·rows + r
  vocab_order_.resize(static_cast<size_t>(rows * tp_.size));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < tp_.size; ++k) vocab_order_[static_cast<size_t>(r * tp_.size + k)] = static_cast<int32_t>(k * rows + r);
  backend_->gather_rows(gathered_logits_.data(), share, vocab_order_, logits_.data());
}

}  // namespace

std::unique_ptr<Model> make_llama_model(const Artifact& artifact, KvPool& kv, const ModelOptions& options) {
  return std::make_unique<LlamaModel>(artifact, kv, options);
}

}  // namespace ninfer
