#include "models/qwen3_5.h"
#include "models/quantized_names.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "artifact/artifact.h"
#include "backends/backend.h"
#include "backends/quantized_weight.h"
#include "cache/kv_pool.h"
#include "models/qwen3_5_config.h"
#include "models/rope.h"
#include "models/weight_statistics.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tensor_slices.h"

namespace ninfer {

namespace {

// run_step variants (Backend::run_step): op lists that equal staged sizes do not tell apart.
constexpr int64_t kStepPlain = 0;
constexpr int64_t kStepWithHidden = 1;  // the main step plus the final norm for the MTP head
constexpr int64_t kMtpHeadStep = 2;     // + MTP layer + 64 * the scored vocabulary

ModelInfo describe(const Artifact& artifact, const Qwen35Config& cfg) {
  ModelInfo info;
  info.architecture = artifact.architecture();
  info.vocab_size = cfg.vocab;
  info.hidden_size = cfg.hidden;
  info.num_layers = cfg.layers;
  info.num_kv_layers = cfg.kv_pool_layers();
  info.num_kv_heads = cfg.kv_heads;
  info.head_dim = cfg.head_dim;
  info.max_position_embeddings = cfg.max_positions;
  add_weight_statistics(artifact, info);
  return info;
}

// Whether a rank keeps whole experts (expert parallelism: the group divides the experts) rather
// than a slice of every expert's columns.
bool expert_parallel(const Qwen35Config& cfg, const TensorParallelRank& tp) {
  return cfg.moe && tp.active() && cfg.num_experts % tp.size == 0;
}

// One tensor-parallel rank's share of the dimensions the group splits: attention heads, GDN key
// and value heads, MLP / shared-expert columns, and the routed experts: whole experts per rank
// when the group divides them, else a slice of every expert's columns. The router stays whole,
// so every rank routes every token alike.
Qwen35Config rank_config(Qwen35Config cfg, const TensorParallelRank* tp) {
  if (!tp || !tp->active()) return cfg;
  cfg.kv_heads = tp->kv_heads(cfg.heads, cfg.kv_heads);
  cfg.heads = tp->share(cfg.heads, "num_attention_heads");
  cfg.gdn.key_heads = tp->share(cfg.gdn.key_heads, "linear_num_key_heads");
  cfg.gdn.value_heads = tp->share(cfg.gdn.value_heads, "linear_num_value_heads");
  if (cfg.moe) {
    if (!expert_parallel(cfg, *tp)) cfg.moe_ff = tp->share(cfg.moe_ff, "moe_intermediate_size");
    cfg.shared_ff = tp->share(cfg.shared_ff, "shared_expert_intermediate_size");
  } else {
    cfg.intermediate = tp->share(cfg.intermediate, "intermediate_size");
  }
  return cfg;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A decoder layer's weights. Norm weights of the zero-centred RMSNorms hold 1 + w (folded at
// load); gdn_norm is the GDN output norm's plain gain.
struct Layer {
  bool full_attention = false;
  int64_t kv_layer = -1;   // full attention: its KV layer in the pool
  int64_t gdn_index = -1;  // GDN: its place among the GDN layers (state slot offset)
  Buffer input_norm, post_norm;
  // Gated attention.
  Weight q, k, v, o;
  Buffer q_norm, k_norm;
  // Gated DeltaNet.
  Weight in_qkv, in_z, in_b, in_a, out_proj;
  Buffer conv_weight, A_log, dt_bias, gdn_norm;
  // Dense MLP or shared expert (gate/up/down), MoE router and experts.
  Weight gate, up, down;
  Weight router, shared_gate;
  MoeExperts experts;
};

// One lane's rows in a step, for the GDN layers.
struct LaneRows {
  int lane = 0;
  int32_t row_begin = 0, num_tokens = 0;
  bool keep_states = false;  // write the per-token state history (speculative verification)
};

struct StepLayout {
  std::vector<int32_t> positions;
  std::vector<AttentionSlice> attention;
  std::vector<LaneRows> lanes;
};

class Qwen35Model final : public Model, public MtpHead {
 public:
  Qwen35Model(const Artifact& artifact, KvPool& kv, const ModelOptions& options)
      : cfg_(rank_config(read_qwen3_5_config(artifact), options.tensor_parallel)),
        full_(read_qwen3_5_config(artifact)), info_(describe(artifact, full_)), rope_(artifact.config()), kv_(kv),
        options_(options), artifact_(artifact),
        tp_(options.tensor_parallel ? *options.tensor_parallel : TensorParallelRank{}) {
    if (options.max_batch_tokens <= 0 || options.max_lanes <= 0)
      throw std::runtime_error("max_batch_tokens and max_lanes must be positive");
    if (kv.num_layers() != cfg_.kv_pool_layers() || kv.num_kv_heads() != cfg_.kv_heads || kv.head_dim() != cfg_.head_dim)
      throw std::runtime_error("the KV pool's geometry does not match the model (use kv_geometry)");
    backend_ = make_backend(options.device, options.threads);
    load_weights();
    allocate();
    if (cfg_.moe)
      for (const auto* layers : {&layers_, &mtp_layers_})
        for (const Layer& L : *layers) backend_->reserve_moe_experts(L.experts);
    // Last: with --kv-capacity auto the pool takes what the weights and workspaces leave.
    backend_->bind_kv(kv_);
    if (!rope_.depends_on_length()) rope_table_ = rope_.table(cfg_.max_positions);
  }

  const ModelInfo& info() const override { return info_; }
  void forward(const BatchPlan& plan, float* logits) override;
  bool samples_on_device() const override { return backend_->samples_on_device(); }
  void forward_sampled(const BatchPlan& plan, const SamplingBatch& sampling, int32_t* ids) override;
  void reset_lane(int lane) override;
  void keep_prefix(int lane, int32_t length) override;
  bool has_recurrent_state() const override { return lane_state_floats() > 0; }
  int snapshot_slots() const override { return has_recurrent_state() ? options_.snapshot_slots : 0; }
  void save_snapshot(int lane, int slot) override;
  void resume_lane(int lane, int32_t position, int slot) override;
  void kv_page_io(int32_t page, void* host, bool to_host) override { backend_->kv_page_io(kv_, page, host, to_host); }
  int64_t snapshot_floats() const override { return lane_state_floats(); }
  void snapshot_io(int slot, float* host, bool to_host) override;

  int64_t mtp_layers() const override { return cfg_.mtp_layers; }
  int64_t proposal_vocab() const override {
    return proposal_head_ ? proposal_head_.rows + static_cast<int64_t>(proposal_extra_.size()) : cfg_.vocab;
  }
  int32_t proposal_token(int64_t column) const override {
    if (!proposal_head_ || column < proposal_head_.rows) return static_cast<int32_t>(column);
    return proposal_extra_.at(static_cast<size_t>(column - proposal_head_.rows));
  }
  void set_proposal_extra_ids(std::vector<int32_t> ids) override {
    // A tokenizer may list more tokens than the lm_head has rows; those can never be sampled.
    std::erase_if(ids, [&](int32_t id) { return id < 0 || id >= cfg_.vocab; });
    requested_extra_ = std::move(ids);
    rebuild_proposal_extras();
  }
  void set_proposal_vocab(int64_t tokens) override {
    if (tokens < 0) throw std::invalid_argument("the proposal head size must not be negative");
    if (cfg_.mtp_layers == 0 && tokens > 0) throw std::invalid_argument("this artifact has no MTP head to draft with");
    if (tokens == 0 || tokens >= cfg_.vocab) {
      proposal_head_ = {};
      rebuild_proposal_extras();
      return;
    }
    // Row-major formats make the lowest ids a prefix of the matrix; a block-quantized matrix
    // keeps its scales per block of rows and is not cut.
    if (is_block_quantized(lm_head_.dtype))
      throw std::invalid_argument("--lm-head-draft needs an unquantized lm_head; this artifact's is " +
                                  std::string(dtype_name(lm_head_.dtype)));
    if (vocab_parallel_) throw std::invalid_argument("--lm-head-draft does not run under tensor parallelism yet");
    proposal_head_ = lm_head_;
    proposal_head_.rows = tokens;
    rebuild_proposal_extras();
  }
  // The extra ids above the prefix, sorted, and one lm_head row view per run of consecutive
  // ids (Qwen's added tokens are one block, so this is usually one small matmul).
  void rebuild_proposal_extras() {
    proposal_extra_.clear();
    proposal_runs_.clear();
    if (!proposal_head_) return;
    for (int32_t id : requested_extra_)
      if (id >= proposal_head_.rows) proposal_extra_.push_back(id);
    std::sort(proposal_extra_.begin(), proposal_extra_.end());
    proposal_extra_.erase(std::unique(proposal_extra_.begin(), proposal_extra_.end()), proposal_extra_.end());
    for (size_t i = 0; i < proposal_extra_.size();) {
      size_t j = i + 1;
      while (j < proposal_extra_.size() && proposal_extra_[j] == proposal_extra_[j - 1] + 1) ++j;
      proposal_runs_.push_back(weight_rows(lm_head_, proposal_extra_[i], static_cast<int64_t>(j - i)));
      i = j;
    }
    // Sized once for the widest plan, so a captured graph's output pointer never moves.
    const auto extras = static_cast<int64_t>(proposal_extra_.size());
    extra_logits_ = extras > 0 ? backend_->alloc(std::max<int64_t>(options_.max_batch_tokens, 1) * extras) : Buffer{};
  }
  void forward_mtp(const BatchPlan& plan, const float* hidden_prev, int step, float* logits,
                   float* hidden_out) override;
  void forward_mtp_rows(const BatchPlan& plan, const float* hidden_prev, int step, std::span<const int32_t> rows,
                        float* logits, float* hidden_out) override;

 private:
  bool random_weights() const { return options_.random_weights_seed >= 0; }
  // The format of a random weight: options_.random_weights_dtype where an artifact of that
  // format would quantize the matrix, else bf16.
  DType random_dtype(const std::string& name, int64_t cols) const {
    const DType dtype = dtype_from_name(options_.random_weights_dtype);
    return is_block_quantized(dtype) && quantizable_weight(name, cols, dtype) ? dtype : DType::BF16;
  }
  int64_t lane_state_floats() const {
    return cfg_.gdn_layers() * (cfg_.gdn.conv_state_floats() + cfg_.gdn.ssm_state_floats());
  }
  float* conv_state(int lane, int64_t gdn_index) const {
    return state_.data() + lane * lane_state_floats() +
           gdn_index * (cfg_.gdn.conv_state_floats() + cfg_.gdn.ssm_state_floats());
  }
  float* ssm_state(int lane, int64_t gdn_index) const {
    return conv_state(lane, gdn_index) + cfg_.gdn.conv_state_floats();
  }
  // Speculative verification: each GDN layer's conv and recurrent state after every token of
  // a keep_states slice, [lanes, gdn layers, W conv states | W ssm states] with W =
  // max_verify_tokens, so keep_prefix can go back to any accepted length by one copy.
  int64_t lane_history_floats() const { return options_.max_verify_tokens * lane_state_floats(); }
  float* conv_history(int lane, int64_t gdn_index) const {
    const int64_t w = options_.max_verify_tokens;
    return history_.data() + lane * lane_history_floats() +
           gdn_index * w * (cfg_.gdn.conv_state_floats() + cfg_.gdn.ssm_state_floats());
  }
  float* ssm_history(int lane, int64_t gdn_index) const {
    return conv_history(lane, gdn_index) + options_.max_verify_tokens * cfg_.gdn.conv_state_floats();
  }

  // Enqueues the step (lanes marked mid-step); its logits stay in logits_ (backend memory).
  // Returns their row count, or -1 for a plan without tokens (nothing enqueued).
  int64_t enqueue_step(const BatchPlan& plan);
  void finish_step(const BatchPlan& plan);
  const TensorView& checked(const std::string& name, const std::vector<int64_t>& shape) const;
  // Shapes are the whole tensor's; `part` is what this rank keeps (tensor parallelism).
  Weight matrix(const std::string& name, int64_t rows, int64_t cols, const TensorPart& part = {});
  // `matrices`: the matrices of the stack the part keeps (0 = shape[0]).
  Weight stacked(const std::string& name, const std::vector<int64_t>& shape, const TensorPart& part = {},
                 int64_t matrices = 0);
  Buffer filled(int64_t size, float value);
  Buffer vector(const std::string& name, const std::vector<int64_t>& shape, float random_value,
                const TensorPart& part = {});
  // --- tensor parallelism (no-ops without it) ---
  TensorPart rows_part(std::vector<RowRange> ranges) const {
    return tp_.active() ? TensorPart{std::move(ranges), {}} : TensorPart::all();
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
  Buffer zero_centered_norm(const std::string& name, int64_t size);

  void load_attention(Layer& L, const std::string& p);
  void load_gdn(Layer& L, const std::string& p);
  void load_mlp(Layer& L, const std::string& p);
  void load_weights();
  void allocate();

  StepLayout layout(const BatchPlan& plan, bool hybrid_state) const;
  void apply_rope(float* x, int64_t heads, const StepLayout& step);
  // The matmuls a layer's mixer (attention q/k/v, or the GDN's in_proj qkv/z/b/a) or dense MLP
  // (gate, up) applies to normed_ first: what add_rms_norm_matmul runs right after the norm.
  struct Projections {
    MatmulOutput outputs[4];
    size_t count = 0;
    std::span<const MatmulOutput> span() const { return {outputs, count}; }
  };
  Projections mixer_projections(const Layer& L);
  Projections gate_up_projections(const Layer& L);
  // projected: the projections of normed_ were already made (add_rms_norm_matmul).
  void attention_mixer(const Layer& L, int64_t t, const StepLayout& step, float* out, bool projected);
  void gdn_mixer(const Layer& L, int64_t t, const StepLayout& step, float* out, bool projected);
  void mlp(const Layer& L, int64_t t, float* out, bool projected);
  // input_normed: normed_ already holds L's input norm and its mixer projections (fused into the
  // previous layer's residual add); next: the following layer, whose input norm and mixer
  // projections are fused into this layer's last add.
  void decoder_layer(const Layer& L, int64_t t, const StepLayout& step, bool input_normed = false,
                     const Layer* next = nullptr);

  Qwen35Config cfg_;   // this rank's dimensions (the whole model's without tensor parallelism)
  Qwen35Config full_;  // the whole model's
  ModelInfo info_;
  RopeScaling rope_;
  RopeTable rope_table_;
  KvPool& kv_;
  ModelOptions options_;
  const Artifact& artifact_;
  TensorParallelRank tp_;
  TensorSlices slices_;          // this rank's parts of split tensors
  bool vocab_parallel_ = false;  // the LM head holds vocab / size rows of this rank
  std::unique_ptr<Backend> backend_;

  Weight embed_, lm_head_;
  // --lm-head-draft: the MTP head's proposal head, the first options_.proposal_vocab rows of
  // lm_head_ (a view, no copy); empty when drafting scores the full vocabulary.
  Weight proposal_head_;
  // Ids it scores beside the prefix (set_proposal_extra_ids): as asked, and those that count
  // (above the prefix, sorted, unique) with their lm_head row runs and their logits [rows, extras].
  std::vector<int32_t> requested_extra_, proposal_extra_;
  std::vector<Weight> proposal_runs_;
  Buffer extra_logits_;
  Buffer final_norm_;
  std::vector<Layer> layers_;
  // MTP head: fc, its norms, and its decoder layers (full attention with the model's MLP type).
  Weight mtp_fc_;
  Buffer mtp_norm_embedding_, mtp_norm_hidden_, mtp_norm_;
  std::vector<Layer> mtp_layers_;

  Buffer state_;                    // [lanes, gdn layers, conv state | ssm state]
  Buffer snapshots_;                // [snapshot slots, gdn layers, conv state | ssm state]
  std::vector<int64_t> lane_pos_;   // tokens a lane's state has absorbed; -1 after a failed step
  Buffer history_;                  // see conv_history
  // The lane's last keep_states slice (start, tokens), until keep_prefix; tokens 0 = none.
  std::vector<std::pair<int32_t, int32_t>> verified_;

  Buffer hidden_, normed_, branch_;
  Buffer q_proj_, q_, gate_, k_, v_, attn_;
  Buffer mixed_, z_, b_, a_, gdn_out_;
  Buffer ff_gate_, ff_up_, router_, shared_gate_, shared_out_;
  Buffer mtp_cat_, logit_inputs_, logits_;
  Buffer rank_logits_, gathered_logits_;  // vocabulary-parallel LM head
  std::vector<int32_t> vocab_order_;      // gathered_logits_ row of each logits_ row part
};

const TensorView& Qwen35Model::checked(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorView* t = artifact_.find(name);
  if (!t) throw std::runtime_error("artifact lacks tensor '" + name + "'");
  if (t->shape != shape)
    throw std::runtime_error("tensor '" + name + "' has shape " + shape_text(t->shape) + ", expected " +
                             shape_text(shape));
  return *t;
}

Weight Qwen35Model::matrix(const std::string& name, int64_t rows, int64_t cols, const TensorPart& part) {
  if (random_weights()) {
    // Uniform in [-a, a] with a = sqrt(3 / cols): unit-variance outputs for unit-RMS inputs.
    const uint64_t seed = std::hash<std::string>{}(name) ^ static_cast<uint64_t>(options_.random_weights_seed);
    const int64_t kept_rows = part.kept_rows(rows), kept_cols = part.kept_columns(cols);
    const Weight w = backend_->random_quantized_weight(random_dtype(name, kept_cols), kept_rows, kept_cols, kept_rows,
                                                       seed, std::sqrt(3.0f / static_cast<float>(cols)));
    add_random_weight_statistics(info_, w);
    return w;
  }
  return backend_->upload_weight(part.select(slices_, checked(name, {rows, cols})));
}

// A stacked [E, r, c] tensor as one [E·r, c] weight (the MoeExperts layout).
Weight Qwen35Model::stacked(const std::string& name, const std::vector<int64_t>& shape, const TensorPart& part,
                            int64_t matrices) {
  if (random_weights()) {
    const uint64_t seed = std::hash<std::string>{}(name) ^ static_cast<uint64_t>(options_.random_weights_seed);
    const int64_t rows = part.kept_rows(shape[0] * shape[1]), cols = part.kept_columns(shape[2]);
    const int64_t group_rows = rows / (matrices > 0 ? matrices : shape[0]);
    const Weight w = backend_->random_quantized_weight(random_dtype(name, cols), rows, cols, group_rows, seed,
                                                       std::sqrt(3.0f / static_cast<float>(shape[2])));
    add_random_weight_statistics(info_, w);
    return w;
  }
  TensorView flat = checked(name, shape);
  flat.shape = {shape[0] * shape[1], shape[2]};
  return backend_->upload_weight(part.select(slices_, flat));
}

Buffer Qwen35Model::filled(int64_t size, float value) {
  Buffer out = backend_->alloc(size);
  const std::vector<float> host(static_cast<size_t>(size), value);
  backend_->copy_from_host(out.data(), host.data(), size);
  return out;
}

// A tensor of any shape as flat float32 (e.g. conv1d.weight [C, 1, K] → [C·K]).
Buffer Qwen35Model::vector(const std::string& name, const std::vector<int64_t>& shape, float random_value,
                           const TensorPart& part) {
  if (random_weights()) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    n = part.kept_rows(n);
    add_random_weight_statistics(info_, DType::F32, 1, n);
    return filled(n, random_value);
  }
  TensorView flat = checked(name, shape);
  flat.shape = {flat.numel()};
  return backend_->upload_vector(part.select(slices_, flat));
}

Buffer Qwen35Model::zero_centered_norm(const std::string& name, int64_t size) {
  if (random_weights()) {
    add_random_weight_statistics(info_, DType::F32, 1, size);
    return filled(size, 1.0f);  // w = 0
  }
  Buffer w = vector(name, {size}, 0.0f);
  std::vector<float> host(static_cast<size_t>(size));
  backend_->synchronize();
  backend_->copy_to_host(host.data(), w.data(), size);
  for (float& x : host) x = 1.0f + x;  // fp32 1 + w, as HF rounds it before the multiply
  backend_->copy_from_host(w.data(), host.data(), size);
  return w;
}

void Qwen35Model::load_attention(Layer& L, const std::string& p) {
  const int64_t h = cfg_.hidden, hd = cfg_.head_dim, qd = cfg_.heads * hd, kvd = cfg_.kv_heads * hd;
  // Tensor parallelism: this rank's heads ([query | gate] rows per head with the output gate).
  const int64_t q_rows = cfg_.attn_output_gate ? 2 * qd : qd, full_q_rows = q_rows * (full_.heads / cfg_.heads);
  const int64_t first_kv = tp_.first_kv_head(full_.heads, full_.kv_heads) * hd, full_kvd = full_.kv_heads * hd;
  L.full_attention = true;
  L.q = matrix(p + "self_attn.q_proj.weight", full_q_rows, h, rows_part({{tp_.rank * q_rows, q_rows}}));
  L.k = matrix(p + "self_attn.k_proj.weight", full_kvd, h, rows_part({{first_kv, kvd}}));
  L.v = matrix(p + "self_attn.v_proj.weight", full_kvd, h, rows_part({{first_kv, kvd}}));
  L.o = matrix(p + "self_attn.o_proj.weight", h, full_.heads * hd, columns_part(tp_.rank * qd, qd));
  L.q_norm = zero_centered_norm(p + "self_attn.q_norm.weight", hd);
  L.k_norm = zero_centered_norm(p + "self_attn.k_norm.weight", hd);
}

void Qwen35Model::load_gdn(Layer& L, const std::string& p) {
  const GdnShape& g = cfg_.gdn;
  const GdnShape& G = full_.gdn;
  const int64_t h = cfg_.hidden;
  const std::string a = p + "linear_attn.";
  // Tensor parallelism: this rank's key heads and the value heads that read them, in each of
  // the q | k | v channel blocks of the projection and the conv (K taps per channel).
  const int64_t r = tp_.rank, kw = g.key_width(), vw = g.value_width(), K = g.conv_kernel;
  const std::vector<RowRange> channels = {{r * kw, kw}, {G.key_width() + r * kw, kw}, {2 * G.key_width() + r * vw, vw}};
  std::vector<RowRange> conv_taps;
  for (const auto& c : channels) conv_taps.push_back({c.begin * K, c.count * K});
  const TensorPart value_rows = rows_part({{r * vw, vw}}), head_rows = rows_part({{r * g.value_heads, g.value_heads}});
  L.in_qkv = matrix(a + "in_proj_qkv.weight", G.conv_channels(), h, rows_part(channels));
  L.in_z = matrix(a + "in_proj_z.weight", G.value_width(), h, value_rows);
  L.in_b = matrix(a + "in_proj_b.weight", G.value_heads, h, head_rows);
  L.in_a = matrix(a + "in_proj_a.weight", G.value_heads, h, head_rows);
  L.out_proj = matrix(a + "out_proj.weight", h, G.value_width(), columns_part(r * vw, vw));
  L.conv_weight = vector(a + "conv1d.weight", {G.conv_channels(), 1, K}, 1.0f / static_cast<float>(K),
                         rows_part(conv_taps));
  L.A_log = vector(a + "A_log", {G.value_heads}, 0.0f, head_rows);
  L.dt_bias = vector(a + "dt_bias", {G.value_heads}, 0.0f, head_rows);
  L.gdn_norm = vector(a + "norm.weight", {g.value_dim}, 1.0f);
}

void Qwen35Model::load_mlp(Layer& L, const std::string& p) {
  const int64_t h = cfg_.hidden;
  const std::string m = p + "mlp.";
  const int64_t r = tp_.rank;
  if (!cfg_.moe) {
    const int64_t ff = cfg_.intermediate;
    L.gate = matrix(m + "gate_proj.weight", full_.intermediate, h, rows_part({{r * ff, ff}}));
    L.up = matrix(m + "up_proj.weight", full_.intermediate, h, rows_part({{r * ff, ff}}));
    L.down = matrix(m + "down_proj.weight", h, full_.intermediate, columns_part(r * ff, ff));
    return;
  }
  const int64_t e = cfg_.num_experts, ff = cfg_.moe_ff, full_ff = full_.moe_ff;
  L.router = matrix(m + "gate.weight", e, h);
  if (expert_parallel(cfg_, tp_)) {  // this rank's whole experts
    const int64_t held = e / tp_.size, first = r * held;
    L.experts.gate_up = stacked(m + "experts.gate_up_proj", {e, 2 * ff, h}, rows_part({{first * 2 * ff, held * 2 * ff}}),
                                held);
    L.experts.down = stacked(m + "experts.down_proj", {e, h, ff}, rows_part({{first * h, held * h}}), held);
    L.experts.first_expert = first;
    L.experts.local_experts = held;
  } else {  // every expert's slice of columns (gate rows, then up rows, per expert)
    std::vector<RowRange> expert_rows;
    for (int64_t x = 0; x < e; ++x) {
      expert_rows.push_back({x * 2 * full_ff + r * ff, ff});
      expert_rows.push_back({x * 2 * full_ff + full_ff + r * ff, ff});
    }
    L.experts.gate_up = stacked(m + "experts.gate_up_proj", {e, 2 * full_ff, h}, rows_part(expert_rows));
    L.experts.down = stacked(m + "experts.down_proj", {e, h, full_ff}, columns_part(r * ff, ff));
  }
  L.experts.num_experts = e;
  L.experts.ff = ff;
  L.experts.top_k = cfg_.top_k;
  L.experts.renormalize = cfg_.norm_topk;
  const int64_t sff = cfg_.shared_ff;
  L.gate = matrix(m + "shared_expert.gate_proj.weight", full_.shared_ff, h, rows_part({{r * sff, sff}}));
  L.up = matrix(m + "shared_expert.up_proj.weight", full_.shared_ff, h, rows_part({{r * sff, sff}}));
  L.down = matrix(m + "shared_expert.down_proj.weight", h, full_.shared_ff, columns_part(r * sff, sff));
  L.shared_gate = matrix(m + "shared_expert_gate.weight", 1, h);
}

void Qwen35Model::load_weights() {
  const int64_t h = cfg_.hidden;
  embed_ = matrix("model.embed_tokens.weight", cfg_.vocab, h);
  const bool untied = random_weights() ? !cfg_.tie_embeddings : artifact_.find("lm_head.weight") != nullptr;
  // Tensor parallelism: each rank scores its slice of the vocabulary when the group divides it.
  vocab_parallel_ = tp_.active() && cfg_.vocab % tp_.size == 0;
  const int64_t share = vocab_parallel_ ? cfg_.vocab / tp_.size : cfg_.vocab;
  const TensorPart vocab_rows = vocab_parallel_ ? rows_part({{tp_.rank * share, share}}) : TensorPart::all();
  if (untied) lm_head_ = matrix("lm_head.weight", cfg_.vocab, h, vocab_rows);
  else lm_head_ = vocab_parallel_ ? matrix("model.embed_tokens.weight", cfg_.vocab, h, vocab_rows) : embed_;
  final_norm_ = zero_centered_norm("model.norm.weight", h);
  if (cfg_.mtp_layers > 0) {
    requested_extra_ = options_.proposal_extra_ids;
    std::erase_if(requested_extra_, [&](int32_t id) { return id < 0 || id >= cfg_.vocab; });
    set_proposal_vocab(options_.proposal_vocab);
  }
  int64_t kv_layer = 0, gdn_index = 0;
  layers_.resize(static_cast<size_t>(cfg_.layers));
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& L = layers_[static_cast<size_t>(i)];
    L.input_norm = zero_centered_norm(p + "input_layernorm.weight", h);
    L.post_norm = zero_centered_norm(p + "post_attention_layernorm.weight", h);
    if (cfg_.full_attention[static_cast<size_t>(i)]) {
      load_attention(L, p);
      L.kv_layer = kv_layer++;
    } else {
      load_gdn(L, p);
      L.gdn_index = gdn_index++;
    }
    load_mlp(L, p);
  }
  if (cfg_.mtp_layers == 0) return;
  mtp_fc_ = matrix("mtp.fc.weight", h, 2 * h);
  mtp_norm_embedding_ = zero_centered_norm("mtp.pre_fc_norm_embedding.weight", h);
  mtp_norm_hidden_ = zero_centered_norm("mtp.pre_fc_norm_hidden.weight", h);
  mtp_norm_ = zero_centered_norm("mtp.norm.weight", h);
  mtp_layers_.resize(static_cast<size_t>(cfg_.mtp_layers));
  for (int64_t m = 0; m < cfg_.mtp_layers; ++m) {
    const std::string p = "mtp.layers." + std::to_string(m) + ".";
    Layer& L = mtp_layers_[static_cast<size_t>(m)];
    L.input_norm = zero_centered_norm(p + "input_layernorm.weight", h);
    L.post_norm = zero_centered_norm(p + "post_attention_layernorm.weight", h);
    load_attention(L, p);
    L.kv_layer = kv_layer++;
    load_mlp(L, p);
  }
}

void Qwen35Model::allocate() {
  const int64_t t = options_.max_batch_tokens, h = cfg_.hidden, qd = cfg_.heads * cfg_.head_dim;
  const int64_t kvd = cfg_.kv_heads * cfg_.head_dim;
  const GdnShape& g = cfg_.gdn;
  Backend& b = *backend_;
  hidden_ = b.alloc(t * h);
  normed_ = b.alloc(t * h);
  branch_ = b.alloc(t * h);
  if (cfg_.full_attention_layers() + cfg_.mtp_layers > 0) {
    if (cfg_.attn_output_gate) {
      q_proj_ = b.alloc(t * 2 * qd);
      gate_ = b.alloc(t * qd);
    }
    q_ = b.alloc(t * qd);
    k_ = b.alloc(t * kvd);
    v_ = b.alloc(t * kvd);
    attn_ = b.alloc(t * qd);
  }
  if (cfg_.gdn_layers() > 0) {
    mixed_ = b.alloc(t * g.conv_channels());
    z_ = b.alloc(t * g.value_width());
    b_ = b.alloc(t * g.value_heads);
    a_ = b.alloc(t * g.value_heads);
    gdn_out_ = b.alloc(t * g.value_width());
  }
  const int64_t ff = cfg_.moe ? cfg_.shared_ff : cfg_.intermediate;
  ff_gate_ = b.alloc(t * ff);
  ff_up_ = b.alloc(t * ff);
  if (cfg_.moe) {
    router_ = b.alloc(t * cfg_.num_experts);
    shared_gate_ = b.alloc(t);
    shared_out_ = b.alloc(t * h);
  }
  if (cfg_.mtp_layers > 0) mtp_cat_ = b.alloc(t * 2 * h);
  const int64_t state_floats = static_cast<int64_t>(options_.max_lanes) * lane_state_floats();
  if (state_floats > 0) {
    state_ = b.alloc(state_floats);
    b.fill_zero(state_.data(), state_floats);
  }
  lane_pos_.assign(static_cast<size_t>(options_.max_lanes), 0);
  verified_.assign(static_cast<size_t>(options_.max_lanes), {0, 0});
  if (options_.max_verify_tokens > 0 && lane_state_floats() > 0)
    history_ = b.alloc(static_cast<int64_t>(options_.max_lanes) * lane_history_floats());
  if (state_floats > 0 && options_.snapshot_slots > 0)
    snapshots_ = b.alloc(static_cast<int64_t>(options_.snapshot_slots) * lane_state_floats());
}

void Qwen35Model::save_snapshot(int lane, int slot) {
  if (!has_recurrent_state()) Model::save_snapshot(lane, slot);
  if (lane < 0 || lane >= options_.max_lanes || slot < 0 || slot >= options_.snapshot_slots)
    throw std::invalid_argument("save_snapshot: lane " + std::to_string(lane) + " or slot " + std::to_string(slot) +
                                " is out of range");
  if (lane_pos_[static_cast<size_t>(lane)] < 0)
    throw std::logic_error("save_snapshot: lane " + std::to_string(lane) + "'s state is undefined after a failed step");
  backend_->copy(snapshots_.data() + static_cast<int64_t>(slot) * lane_state_floats(), conv_state(lane, 0),
                 lane_state_floats());
}

void Qwen35Model::snapshot_io(int slot, float* host, bool to_host) {
  if (slot < 0 || slot >= snapshot_slots()) throw std::invalid_argument("snapshot_io: slot out of range");
  float* at = snapshots_.data() + static_cast<int64_t>(slot) * lane_state_floats();
  backend_->synchronize();
  if (to_host) {
    backend_->copy_to_host(host, at, lane_state_floats());
  } else {
    backend_->copy_from_host(at, host, lane_state_floats());
    backend_->synchronize();
  }
}

void Qwen35Model::resume_lane(int lane, int32_t position, int slot) {
  if (lane < 0 || lane >= options_.max_lanes || position < 0)
    throw std::invalid_argument("resume_lane: lane " + std::to_string(lane) + " or position " +
                                std::to_string(position) + " is out of range");
  if (has_recurrent_state() && position > 0) {
    if (slot < 0 || slot >= options_.snapshot_slots)
      throw std::invalid_argument("resume_lane: a hybrid lane resumes at position " + std::to_string(position) +
                                  " only from a state snapshot (slot " + std::to_string(slot) + ")");
    backend_->copy(conv_state(lane, 0), snapshots_.data() + static_cast<int64_t>(slot) * lane_state_floats(),
                   lane_state_floats());
  }
  lane_pos_[static_cast<size_t>(lane)] = position;
}

void Qwen35Model::reset_lane(int lane) {
  if (lane < 0 || lane >= options_.max_lanes)
    throw std::invalid_argument("reset_lane: lane " + std::to_string(lane) + " is outside [0, " +
                                std::to_string(options_.max_lanes) + ")");
  if (lane_state_floats() > 0) backend_->fill_zero(conv_state(lane, 0), lane_state_floats());
  lane_pos_[static_cast<size_t>(lane)] = 0;
  verified_[static_cast<size_t>(lane)] = {0, 0};
}

void Qwen35Model::keep_prefix(int lane, int32_t length) {
  if (lane < 0 || lane >= options_.max_lanes)
    throw std::invalid_argument("keep_prefix: lane " + std::to_string(lane) + " is outside [0, " +
                                std::to_string(options_.max_lanes) + ")");
  const auto& [start, tokens] = verified_[static_cast<size_t>(lane)];
  const int64_t pos = lane_pos_[static_cast<size_t>(lane)];
  if (tokens == 0 || pos <= start || pos > start + tokens)
    throw std::invalid_argument("keep_prefix: lane " + std::to_string(lane) + " has no verified slice to roll back");
  if (length <= start || length > start + tokens)
    throw std::invalid_argument("keep_prefix: length " + std::to_string(length) + " is outside the verified slice (" +
                                std::to_string(start) + ", " + std::to_string(start + tokens) + "]");
  // Until the lane's next forward the per-token history stays valid, so the engine may step
  // back to a block boundary inside the round (a snapshot there) and then on to its end.
  const int64_t slot = length - start - 1;
  if (length != pos || pos != start + tokens) {
    const int64_t conv = cfg_.gdn.conv_state_floats(), ssm = cfg_.gdn.ssm_state_floats();
    for (int64_t g = 0; g < cfg_.gdn_layers(); ++g) {
      backend_->copy(conv_state(lane, g), conv_history(lane, g) + slot * conv, conv);
      backend_->copy(ssm_state(lane, g), ssm_history(lane, g) + slot * ssm, ssm);
    }
    backend_->synchronize();
  }
  lane_pos_[static_cast<size_t>(lane)] = length;
}

// Validates the plan and lays out its rows. With hybrid_state, each slice must continue its
// lane's recurrent state exactly (the state cannot be rewound) and a lane may appear only once.
StepLayout Qwen35Model::layout(const BatchPlan& plan, bool hybrid_state) const {
  StepLayout step;
  std::vector<bool> seen(static_cast<size_t>(options_.max_lanes), false);
  int32_t row = 0;
  for (const auto& s : plan.slices) {
    if (s.lane < 0 || s.lane >= options_.max_lanes)
      throw std::invalid_argument("slice lane " + std::to_string(s.lane) + " is outside [0, " +
                                  std::to_string(options_.max_lanes) + ")");
    if (s.num_tokens <= 0 || s.start_pos < 0)
      throw std::invalid_argument("a slice needs at least one token and a non-negative start position");
    if (!s.page_table && s.num_pages > 0) throw std::invalid_argument("slice has pages but no page table");
    if (hybrid_state) {
      if (seen[static_cast<size_t>(s.lane)])
        throw std::invalid_argument("lane " + std::to_string(s.lane) + " appears twice in one plan");
      seen[static_cast<size_t>(s.lane)] = true;
      const int64_t at = lane_pos_[static_cast<size_t>(s.lane)];
      if (at < 0)
        throw std::invalid_argument("lane " + std::to_string(s.lane) +
                                    "'s recurrent state is undefined after a failed step; reset the lane");
      if (at != s.start_pos)
        throw std::invalid_argument("lane " + std::to_string(s.lane) + "'s recurrent state holds " +
                                    std::to_string(at) + " tokens but the slice starts at position " +
                                    std::to_string(s.start_pos) +
                                    " (a hybrid model's state cannot be rewound; reset the lane)");
    }
    step.attention.push_back({row, s.num_tokens, s.start_pos, s.page_table, s.num_pages});
    if (s.keep_states && s.num_tokens > options_.max_verify_tokens)
      throw std::invalid_argument("a verified slice of " + std::to_string(s.num_tokens) +
                                  " tokens exceeds max_verify_tokens " + std::to_string(options_.max_verify_tokens));
    step.lanes.push_back({s.lane, row, s.num_tokens, s.keep_states});
    for (int32_t i = 0; i < s.num_tokens; ++i) step.positions.push_back(s.start_pos + i);
    row += s.num_tokens;
  }
  if (row != static_cast<int64_t>(plan.tokens.size()))
    throw std::invalid_argument("plan slices cover " + std::to_string(row) + " tokens but the plan holds " +
                                std::to_string(plan.tokens.size()));
  if (row > options_.max_batch_tokens)
    throw std::invalid_argument("plan of " + std::to_string(row) + " tokens exceeds max_batch_tokens " +
                                std::to_string(options_.max_batch_tokens));
  return step;
}

void Qwen35Model::apply_rope(float* x, int64_t heads, const StepLayout& step) {
  const int64_t hd = cfg_.head_dim;
  if (!rope_.depends_on_length()) {
    backend_->rope(x, heads, hd, rope_.rotary_dim(), step.positions, rope_table_.inv_freq,
                   rope_table_.attention_factor);
    return;
  }
  // Dynamic scaling: each sequence uses the table for its own length, as HF does per call.
  for (const auto& s : step.attention) {
    const RopeTable table = rope_.table(static_cast<int64_t>(s.start_pos) + s.num_tokens);
    backend_->rope(x + static_cast<int64_t>(s.row_begin) * heads * hd, heads, hd, rope_.rotary_dim(),
                   std::span(step.positions).subspan(static_cast<size_t>(s.row_begin), s.num_tokens),
                   table.inv_freq, table.attention_factor);
  }
}

Qwen35Model::Projections Qwen35Model::mixer_projections(const Layer& L) {
  if (L.full_attention)
    return {{{&L.q, nullptr, cfg_.attn_output_gate ? q_proj_.data() : q_.data()},
             {&L.k, nullptr, k_.data()},
             {&L.v, nullptr, v_.data()}},
            3};
  return {{{&L.in_qkv, nullptr, mixed_.data()},
           {&L.in_z, nullptr, z_.data()},
           {&L.in_b, nullptr, b_.data()},
           {&L.in_a, nullptr, a_.data()}},
          4};
}

Qwen35Model::Projections Qwen35Model::gate_up_projections(const Layer& L) {
  return {{{&L.gate, nullptr, ff_gate_.data()}, {&L.up, nullptr, ff_up_.data()}}, 2};
}

// Gated full attention (spec §2.3) of normed_ into out [t, hidden].
void Qwen35Model::attention_mixer(const Layer& L, int64_t t, const StepLayout& step, float* out, bool projected) {
  Backend& b = *backend_;
  const int64_t hd = cfg_.head_dim;
  float* q = q_.data();
  if (!projected) b.matmul_many(normed_.data(), t, mixer_projections(L).span());
  if (cfg_.attn_output_gate) b.split_query_gate(q_proj_.data(), t, cfg_.heads, hd, q, gate_.data());
  b.head_rms_norm(q, t * cfg_.heads, hd, L.q_norm.data(), cfg_.eps, q);
  b.head_rms_norm(k_.data(), t * cfg_.kv_heads, hd, L.k_norm.data(), cfg_.eps, k_.data());
  apply_rope(q, cfg_.heads, step);
  apply_rope(k_.data(), cfg_.kv_heads, step);
  b.kv_write(kv_, L.kv_layer, k_.data(), v_.data(), step.attention);
  const AttentionShape shape{cfg_.heads, cfg_.kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  b.attention(kv_, L.kv_layer, q, step.attention, shape, attn_.data());
  if (cfg_.attn_output_gate) b.sigmoid_mul(attn_.data(), gate_.data(), t * cfg_.heads * hd);
  b.matmul(attn_.data(), t, L.o, nullptr, out);
  reduce_partial_sums(out, t * cfg_.hidden);
}

// Gated DeltaNet (spec §2.4) of normed_ into out [t, hidden], continuing each lane's state.
void Qwen35Model::gdn_mixer(const Layer& L, int64_t t, const StepLayout& step, float* out, bool projected) {
  Backend& b = *backend_;
  if (!projected) b.matmul_many(normed_.data(), t, mixer_projections(L).span());
  std::vector<GdnSlice> slices;
  slices.reserve(step.lanes.size());
  for (const auto& r : step.lanes) {
    GdnSlice slice{r.row_begin, r.num_tokens, conv_state(r.lane, L.gdn_index), ssm_state(r.lane, L.gdn_index)};
    if (r.keep_states) {
      slice.conv_history = conv_history(r.lane, L.gdn_index);
      slice.ssm_history = ssm_history(r.lane, L.gdn_index);
    }
    slices.push_back(slice);
  }
  const GdnLayerWeights weights{L.conv_weight.data(), L.A_log.data(), L.dt_bias.data(), L.gdn_norm.data()};
  b.gdn_mixer_projected(cfg_.gdn, weights, slices, mixed_.data(), z_.data(), b_.data(), a_.data(), gdn_out_.data(),
                        L.out_proj, out);
  reduce_partial_sums(out, t * cfg_.hidden);
}

// Dense SwiGLU MLP or sparse MoE with the sigmoid-gated shared expert (spec §2.5-2.6), of
// normed_ into out [t, hidden].
void Qwen35Model::mlp(const Layer& L, int64_t t, float* out, bool projected) {
  Backend& b = *backend_;
  const int64_t h = cfg_.hidden;
  float* x = normed_.data();
  float* dense_out = out;
  if (cfg_.moe) {
    const MoeMlp fused{&L.router, &L.experts, &L.shared_gate, &L.gate, &L.up, &L.down, cfg_.shared_ff};
    if (b.moe_mlp_fused(x, t, h, fused, out)) {
      reduce_partial_sums(out, t * h);
      return;
    }
    b.matmul(x, t, L.router, nullptr, router_.data());
    b.moe_experts(x, t, h, router_.data(), L.experts, out);
    b.matmul(x, t, L.shared_gate, nullptr, shared_gate_.data());
    dense_out = shared_out_.data();
  }
  if (!projected) b.matmul_many(x, t, gate_up_projections(L).span());
  b.swiglu_matmul(ff_gate_.data(), ff_up_.data(), t, L.down, dense_out);
  if (cfg_.moe) b.add_sigmoid_gated(out, shared_out_.data(), shared_gate_.data(), t, h);
  reduce_partial_sums(out, t * h);  // the experts' and the shared expert's partial sums at once
}

void Qwen35Model::decoder_layer(const Layer& L, int64_t t, const StepLayout& step, bool input_normed,
                                const Layer* next) {
  Backend& b = *backend_;
  const int64_t h = cfg_.hidden;
  if (!input_normed) b.rms_norm(hidden_.data(), t, h, L.input_norm.data(), cfg_.eps, normed_.data());
  if (L.full_attention) {
    attention_mixer(L, t, step, branch_.data(), input_normed);
  } else {
    gdn_mixer(L, t, step, branch_.data(), input_normed);
  }
  if (cfg_.moe) {  // the routed MLP starts with its own fused kernels
    b.add_rms_norm(hidden_.data(), branch_.data(), t, h, L.post_norm.data(), cfg_.eps, normed_.data());
  } else {
    b.add_rms_norm_matmul(hidden_.data(), branch_.data(), t, h, L.post_norm.data(), cfg_.eps, normed_.data(),
                          gate_up_projections(L).span());
  }
  mlp(L, t, branch_.data(), !cfg_.moe);
  if (next)
    b.add_rms_norm_matmul(hidden_.data(), branch_.data(), t, h, next->input_norm.data(), cfg_.eps, normed_.data(),
                          mixer_projections(*next).span());
  else
    b.add(hidden_.data(), branch_.data(), t * h);
}

void Qwen35Model::forward(const BatchPlan& plan, float* logits) {
  const int64_t rows = enqueue_step(plan);
  if (rows < 0) return;
  backend_->synchronize();
  if (rows > 0) backend_->copy_to_host(logits, logits_.data(), rows * cfg_.vocab);
  finish_step(plan);
}

// After a step: hidden states for the draft head, and each lane's new position.
void Qwen35Model::finish_step(const BatchPlan& plan) {
  if (plan.hidden_out)
    backend_->copy_to_host(plan.hidden_out, normed_.data(), static_cast<int64_t>(plan.tokens.size()) * cfg_.hidden);
  for (const auto& s : plan.slices) {
    lane_pos_[static_cast<size_t>(s.lane)] = s.start_pos + s.num_tokens;
    verified_[static_cast<size_t>(s.lane)] = {s.start_pos, s.keep_states ? s.num_tokens : 0};
  }
}

void Qwen35Model::forward_sampled(const BatchPlan& plan, const SamplingBatch& sampling, int32_t* ids) {
  check_sampling_rows(plan, sampling);
  const int64_t rows = enqueue_step(plan);
  if (rows < 0) return;
  if (rows > 0) backend_->sample_rows(logits_.data(), cfg_.vocab, sampling, ids);
  backend_->synchronize();
  finish_step(plan);
}

int64_t Qwen35Model::enqueue_step(const BatchPlan& plan) {
  const StepLayout step = layout(plan, true);
  const int64_t t = static_cast<int64_t>(plan.tokens.size());
  if (t == 0) return -1;
  std::vector<int32_t> logit_rows;
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const SeqSlice& s = plan.slices[i];
    for (int32_t r = s.num_tokens - s.logit_rows(); r < s.num_tokens; ++r)
      logit_rows.push_back(step.attention[i].row_begin + r);
  }
  // Until the step completes, the lanes' states are half-updated: a failure leaves them undefined.
  for (const auto& s : plan.slices) lane_pos_[static_cast<size_t>(s.lane)] = -1;
  Backend& b = *backend_;
  const int64_t h = cfg_.hidden;
  const auto rows = static_cast<int64_t>(logit_rows.size());
  if (logits_.size() < rows * cfg_.vocab) {  // before run_step: a step's ops must not allocate
    logit_inputs_ = b.alloc(rows * h);
    logits_ = b.alloc(rows * cfg_.vocab);
    if (vocab_parallel_) {
      rank_logits_ = b.alloc(rows * cfg_.vocab / tp_.size);
      gathered_logits_ = b.alloc(rows * cfg_.vocab);
    }
  }
  if (plan.hidden_out && cfg_.mtp_layers == 0)
    throw std::invalid_argument("this artifact has no MTP head to read hidden states (hidden_out)");
  // A graph replays one fixed op list: decode steps and verification rounds (slices of one
  // token, or of k + 1 tokens that keep their state history) qualify; a prefill chunk does not.
  bool graphable = true;
  for (const auto& s : plan.slices)
    graphable = graphable && (s.num_tokens == 1 || (s.keep_states && s.num_tokens <= options_.max_verify_tokens));
  // The hidden states for the MTP head add a norm to the op list (their copy follows the step).
  const int64_t variant = plan.hidden_out ? kStepWithHidden : kStepPlain;
  b.run_step(graphable, [&] {
    b.embedding(embed_, plan.tokens, hidden_.data());
    for (size_t i = 0; i < layers_.size(); ++i)
      decoder_layer(layers_[i], t, step, i > 0, i + 1 < layers_.size() ? &layers_[i + 1] : nullptr);
    if (plan.hidden_out) b.rms_norm(hidden_.data(), t, h, final_norm_.data(), cfg_.eps, normed_.data());
    if (rows == 0) return;
    b.gather_rows(hidden_.data(), h, logit_rows, logit_inputs_.data());
    b.rms_norm(logit_inputs_.data(), rows, h, final_norm_.data(), cfg_.eps, logit_inputs_.data());
    if (!vocab_parallel_) return b.matmul(logit_inputs_.data(), rows, lm_head_, nullptr, logits_.data());
    b.matmul(logit_inputs_.data(), rows, lm_head_, nullptr, rank_logits_.data());
    gather_vocabulary(rows);
  }, variant);
  return rows;
}

void Qwen35Model::gather_vocabulary(int64_t rows) {
  const int64_t share = cfg_.vocab / tp_.size;
  backend_->synchronize();
  tp_.collective->all_gather(rank_logits_.data(), rows * share, gathered_logits_.data());
  // gathered [rank, row, share] → logits [row, rank, share]: row (r, k) is gathered row k·rows + r
  vocab_order_.resize(static_cast<size_t>(rows * tp_.size));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < tp_.size; ++k)
      vocab_order_[static_cast<size_t>(r * tp_.size + k)] = static_cast<int32_t>(k * rows + r);
  backend_->gather_rows(gathered_logits_.data(), share, vocab_order_, logits_.data());
}

// MTP step (spec §4.1): u = fc([norm_e(embed(token)) | norm_h(hidden_prev)]), one full-attention
// decoder layer, mtp.norm, the shared lm_head.
void Qwen35Model::forward_mtp(const BatchPlan& plan, const float* hidden_prev, int step_index, float* logits,
                              float* hidden_out) {
  std::vector<int32_t> rows(plan.tokens.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
  forward_mtp_rows(plan, hidden_prev, step_index, rows, logits, hidden_out);
}

void Qwen35Model::forward_mtp_rows(const BatchPlan& plan, const float* hidden_prev, int step_index,
                                   std::span<const int32_t> rows, float* logits, float* hidden_out) {
  if (cfg_.mtp_layers == 0) throw std::runtime_error("this artifact has no MTP head");
  if (tp_.active()) throw std::logic_error("the MTP head does not run under tensor parallelism yet");
  if (step_index < 0) throw std::invalid_argument("forward_mtp: step must be >= 0");
  if (!hidden_prev || !logits) throw std::invalid_argument("forward_mtp: null hidden_prev or logits");
  const StepLayout step = layout(plan, false);
  const int64_t t = static_cast<int64_t>(plan.tokens.size()), h = cfg_.hidden;
  if (t == 0) return;
  for (int32_t r : rows)
    if (r < 0 || r >= t) throw std::invalid_argument("forward_mtp: output row " + std::to_string(r) + " is outside the plan");
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t width = proposal_vocab();
  const Weight& head = proposal_head_ ? proposal_head_ : lm_head_;
  const auto extras = static_cast<int64_t>(proposal_extra_.size());
  if (n * extras > extra_logits_.size())
    throw std::invalid_argument("forward_mtp: more output rows than the proposal head was sized for");
  const auto layer = static_cast<size_t>(step_index % cfg_.mtp_layers);
  Backend& b = *backend_;
  if (logits_.size() < n * cfg_.vocab) {
    logit_inputs_ = b.alloc(n * h);
    logits_ = b.alloc(n * cfg_.vocab);
  }
  if (logit_inputs_.size() < n * h) logit_inputs_ = b.alloc(n * h);
  b.copy_from_host(branch_.data(), hidden_prev, t * h);  // before the step: a graph cannot copy pageable memory
  // Draft steps (one token per lane) and the pass over a round's kept positions replay graphs;
  // the pass over a prefill chunk runs eagerly.
  bool graphable = true;
  for (const auto& s : plan.slices) graphable = graphable && s.num_tokens <= std::max(1, options_.max_verify_tokens);
  const int64_t variant = kMtpHeadStep + static_cast<int64_t>(layer) + 64 * width;  // the head's rows are baked in
  b.run_step(graphable, [&] {
    b.embedding(embed_, plan.tokens, normed_.data());
    b.rms_norm(normed_.data(), t, h, mtp_norm_embedding_.data(), cfg_.eps, normed_.data());
    b.rms_norm(branch_.data(), t, h, mtp_norm_hidden_.data(), cfg_.eps, branch_.data());
    b.concat_columns(normed_.data(), h, branch_.data(), h, t, mtp_cat_.data());  // embedding first
    b.matmul(mtp_cat_.data(), t, mtp_fc_, nullptr, hidden_.data());
    decoder_layer(mtp_layers_[layer], t, step);
    b.gather_rows(hidden_.data(), h, rows, logit_inputs_.data());
    b.rms_norm(logit_inputs_.data(), n, h, mtp_norm_.data(), cfg_.eps, logit_inputs_.data());
    b.matmul(logit_inputs_.data(), n, head, nullptr, logits_.data());
    int64_t column = 0;  // the extra ids' columns, run by run: [n, run rows] blocks
    for (const Weight& run : proposal_runs_) {
      b.matmul(logit_inputs_.data(), n, run, nullptr, extra_logits_.data() + n * column);
      column += run.rows;
    }
  }, variant);
  b.synchronize();
  if (extras == 0) {
    b.copy_to_host(logits, logits_.data(), n * width);
  } else {
    // Rows of [prefix | extras]: the prefix block, then each run's block scattered into place.
    const int64_t prefix = head.rows;
    std::vector<float> head_block(static_cast<size_t>(n * prefix)), extra(static_cast<size_t>(n * extras));
    b.copy_to_host(head_block.data(), logits_.data(), n * prefix);
    b.copy_to_host(extra.data(), extra_logits_.data(), n * extras);
    int64_t column = 0;
    for (const Weight& run : proposal_runs_) {
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(extra.data() + n * column + r * run.rows, run.rows, logits + r * width + prefix + column);
      column += run.rows;
    }
    for (int64_t r = 0; r < n; ++r) std::copy_n(head_block.data() + r * prefix, prefix, logits + r * width);
  }
  if (hidden_out) b.copy_to_host(hidden_out, logit_inputs_.data(), n * h);
}

}  // namespace

std::unique_ptr<Model> make_qwen3_5_model(const Artifact& artifact, KvPool& kv, const ModelOptions& options) {
  return std::make_unique<Qwen35Model>(artifact, kv, options);
}

}  // namespace ninfer
