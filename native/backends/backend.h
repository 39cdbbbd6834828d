// The op set every model is written against.
//
// A Backend owns device memory: activation buffers it allocates, and weights uploaded once
// from the mapped artifact (the CPU backend keeps pointers into the mapping: zero copy).
// Every op takes raw backend pointers plus explicit dimensions and knows nothing of models,
// so a CUDA backend implements the same contract with device pointers and a stream.
//
// Per-step metadata that the host computes (token ids, positions, slice layout, page tables)
// is passed as host memory; a device backend uploads it. Ops run in call order; `synchronize`
// orders them before the host reads a result through `copy_to_host`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/row_sampling.h"

namespace ninfer {

class KvPool;
struct TensorView;

// A weight matrix [rows, cols] (row-major, cols contiguous) resident on the backend.
// For Q8_0, cols counts logical elements and each row is cols/32 blocks of 34 bytes.
// For FP8 and NVFP4, data is the codes of row 0 (row_bytes(dtype, cols) per row) and the
// scales are those of the whole tensor the weight was cut from (backends/quantized_weight.h):
// row r of this weight is row first_row + r there.
struct Weight {
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const void* scales = nullptr;  // fp8: f32 block scales; nvfp4: e4m3 per-16 scales
  const float* scale2 = nullptr;  // nvfp4: f32 per-row scales
  int64_t group_rows = 0;         // fp8: rows of one matrix of the stack (block rows restart)
  int64_t first_row = 0;
  explicit operator bool() const { return data != nullptr; }
};

// An owning handle to backend memory of float32 elements (activations, small f32 vectors).
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::shared_ptr<float> storage, int64_t size) : storage_(std::move(storage)), size_(size) {}
  float* data() const { return storage_.get(); }
  int64_t size() const { return size_; }
  explicit operator bool() const { return storage_ != nullptr; }

 private:
  std::shared_ptr<float> storage_;
  int64_t size_ = 0;
};

// One sequence's rows within a step, for the KV-writing and attention ops.
struct AttentionSlice {
  int32_t row_begin = 0;          // first row of this slice in the step's q/k/v/out arrays
  int32_t num_tokens = 0;         // rows of this slice
  int32_t start_pos = 0;          // cache position of the first row
  const int32_t* page_table = nullptr;  // host memory: pages covering [0, start_pos + num_tokens)
  int32_t num_pages = 0;
};

struct AttentionShape {
  int64_t num_heads = 0;          // query heads
  int64_t num_kv_heads = 0;       // key/value heads; num_heads is a multiple of it (GQA)
  int64_t head_dim = 0;
  float scale = 0.0f;             // softmax scale, usually 1/sqrt(head_dim)
};

// One weight of a matmul_many call: y[m, weight->rows] = x · weight^T (+ bias).
struct MatmulOutput {
  const Weight* weight = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};

// --- hybrid models (Qwen3.5/3.6): Gated DeltaNet, gated attention, sparse MoE ----------

// Head layout and constants of a Gated DeltaNet layer (model spec §2.4). Value head j reads
// query/key head j / (value_heads / key_heads): the value heads of one key head are adjacent.
struct GdnShape {
  int64_t key_heads = 0;     // Hk
  int64_t value_heads = 0;   // Hv, a multiple of key_heads
  int64_t key_dim = 0;       // dk
  int64_t value_dim = 0;     // dv
  int64_t conv_kernel = 4;   // K; the conv state keeps K-1 rows
  int64_t chunk_size = 64;   // chunk of the chunked (prefill) form
  float norm_eps = 1e-6f;    // of the gated output RMSNorm

  int64_t key_width() const { return key_heads * key_dim; }
  int64_t value_width() const { return value_heads * value_dim; }
  int64_t conv_channels() const { return 2 * key_width() + value_width(); }  // q | k | v
  int64_t conv_state_floats() const { return (conv_kernel - 1) * conv_channels(); }
  int64_t ssm_state_floats() const { return value_heads * key_dim * value_dim; }
};

// The small per-layer GDN tensors, float32 in backend memory.
struct GdnLayerWeights {
  const float* conv_weight = nullptr;  // [conv_channels, K] (HF conv1d.weight [C, 1, K])
  const float* A_log = nullptr;        // [Hv]
  const float* dt_bias = nullptr;      // [Hv]
  const float* norm_weight = nullptr;  // [dv], a plain gain (not 1 + w)
};

// One sequence of a gdn_mixer call: its rows in the step's arrays and its state slot (backend
// memory). Slices tile the rows in order, as the slices of a BatchPlan do.
struct GdnSlice {
  int32_t row_begin = 0;
  int32_t num_tokens = 0;
  float* conv_state = nullptr;  // [K-1, conv_channels]: the last K-1 pre-conv rows, oldest first
  float* ssm_state = nullptr;   // [Hv, dk, dv] fp32 recurrent state
  // Optional (speculative verification, spec §3.2): the states after each of the slice's
  // tokens. A non-null ssm_history selects the recurrent form for this slice.
  float* conv_history = nullptr;  // [num_tokens, K-1, conv_channels]
  float* ssm_history = nullptr;   // [num_tokens, Hv, dk, dv]
};

// Auto: the chunked form for long slices (CPU: more than one token; CUDA: at least
// kGdnChunkedMinTokens), the recurrent form otherwise. Both give the same result up to rounding
// (CUDA's chunked form: tf32 tensor-core products); the others force one form (tests).
enum class GdnForm { Auto, Chunked, Recurrent };

// The routed experts of a sparse MoE layer (spec §2.6), stacked. Expert e's gate projection is
// rows [e·2ff, e·2ff + ff) of gate_up and its up projection rows [e·2ff + ff, (e+1)·2ff); its
// down projection is rows [e·hidden, (e+1)·hidden) of down. (The artifact's [E, 2ff, H] and
// [E, H, ff] stacks, uploaded as 2-D [E·2ff, H] and [E·H, ff].)
struct MoeExperts {
  Weight gate_up;             // [num_experts · 2·ff, hidden]
  Weight down;                // [num_experts · hidden, ff]
  int64_t num_experts = 0;
  int64_t ff = 0;             // moe_intermediate_size
  int64_t top_k = 0;
  bool renormalize = true;    // divide the top-k probabilities by their sum
  // Expert parallelism: the stacks hold only experts [first_expert, first_expert +
  // local_experts) of the num_experts the router scores (routing is over all of them); pairs
  // routed elsewhere add nothing here. 0 local experts = the stacks hold every expert.
  int64_t first_expert = 0;
  int64_t local_experts = 0;
  int64_t held_experts() const { return local_experts > 0 ? local_experts : num_experts; }

  // Throws std::invalid_argument unless the counts are sane and the stacked weights have the
  // shapes above (with held_experts() matrices) for this hidden size (every backend's
  // moe_experts checks this first).
  void check(int64_t hidden) const;
};

// The weights of a sparse MoE MLP with a sigmoid-gated shared expert (Qwen3.5/3.6 MoE), for
// Backend::moe_mlp_fused.
struct MoeMlp {
  const Weight* router = nullptr;       // [num_experts, hidden]
  const MoeExperts* experts = nullptr;
  const Weight* shared_gate = nullptr;  // [1, hidden]: the shared expert's gate logit
  const Weight* gate = nullptr;         // shared expert [shared_ff, hidden]
  const Weight* up = nullptr;           // shared expert [shared_ff, hidden]
  const Weight* down = nullptr;         // shared expert [hidden, shared_ff]
  int64_t shared_ff = 0;
};

// Backend::kv_page_io for a pool whose storage is in host memory.
void kv_page_io_host(KvPool& kv, int32_t page, void* host, bool to_host);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // --- memory ------------------------------------------------------------------------
  virtual Buffer alloc(int64_t elements) = 0;
  // Makes a 2-D artifact tensor usable as a matmul/embedding weight. The returned Weight
  // stays valid while both the backend and the artifact live. 1-D tensors are viewed as
  // [1, n].
  virtual Weight upload_weight(const TensorView& tensor) = 0;
  // Uploads a 1-D tensor (norm weight, bias) converted to float32.
  virtual Buffer upload_vector(const TensorView& tensor) = 0;
  virtual void copy_from_host(float* dst, const float* src, int64_t elements) = 0;
  virtual void copy_to_host(float* dst, const float* src, int64_t elements) = 0;
  // Runs `enqueue` (the op calls of one model step: re-runnable, no host reads or allocation)
  // now. A backend may instead capture it once as a device graph and replay it for later
  // steps of the same shape; `graphable` is the model's word that the step's op list is fixed
  // by its sizes (decode and verification steps, not prefill chunks). `variant` tells apart
  // op lists the staged sizes alone would not (the model's main step and its MTP head, a step
  // that also emits hidden states): the backend keys its graphs on it too.
  virtual void run_step(bool graphable, const std::function<void()>& enqueue, int64_t variant = 0) {
    (void)graphable;
    (void)variant;
    enqueue();
  }
  virtual void synchronize() = 0;
  // Attaches page storage in this backend's memory to the pool unless it has some already;
  // throws if the pool's storage lives elsewhere. Models call it once at load; kv_write and
  // attention call it too, so a pool built by hand works as well.
  virtual void bind_kv(KvPool& kv) = 0;
  // Copies page `page` of every layer (layer by layer, K then V) between the pool and host
  // memory, in the storage's own element type: kv.page_bytes(element size) bytes (the prefix
  // cache file). The default handles host storage; device backends override it.
  virtual void kv_page_io(KvPool& kv, int32_t page, void* host, bool to_host);
  // A [rows, cols] weight of seeded pseudo-random values, uniform in [-scale, scale], made in
  // backend memory (benchmarks of real shapes without a weight file). Optional.
  virtual Weight random_weight(int64_t rows, int64_t cols, uint64_t seed, float scale);
  // The same values quantized to `dtype` (FP8 or NVFP4; BF16 calls random_weight), for a
  // [rows, cols] weight of `group_rows`-row matrices. Optional.
  virtual Weight random_quantized_weight(DType dtype, int64_t rows, int64_t cols, int64_t group_rows, uint64_t seed,
                                         float scale);

  // --- ops (all array arguments are backend memory unless marked host) ---------------
  // y[m, w.rows] = x[m, w.cols] · w^T (+ bias[w.rows] when bias is non-null).
  virtual void matmul(const float* x, int64_t m, const Weight& w, const float* bias, float* y) = 0;
  // Several matmuls of the same x (all weights have x's width), e.g. q/k/v or gate/up; a
  // backend may run them as one launch.
  virtual void matmul_many(const float* x, int64_t m, std::span<const MatmulOutput> outputs) {
    for (const auto& o : outputs) matmul(x, m, *o.weight, o.bias, o.y);
  }
  // out[i, :] = table[tokens[i], :] as float32. `tokens` is host memory.
  virtual void embedding(const Weight& table, std::span<const int32_t> tokens, float* out) = 0;
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight (x may equal y). The hybrid
  // models' zero-centred "(1 + w)" RMSNorm is this op with the weight 1 + w, which models fold
  // at load (fp32 1 + w, as HF rounds it before the multiply).
  virtual void rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                        float* y) = 0;
  // rms_norm of many short rows: attention's per-head q/k norms (rows = tokens · heads, cols =
  // head_dim; x may equal y). Its own op so that a backend may run it with a kernel shaped for
  // short rows without changing rms_norm's (and add_rms_norm's) results.
  virtual void head_rms_norm(const float* x, int64_t rows, int64_t head_dim, const float* weight, float eps,
                             float* y) {
    rms_norm(x, rows, head_dim, weight, eps, y);
  }
  // Rotates x[t, h, 0:rotary_dim] in place by angle positions[t] * inv_freq[i] (HF
  // rotate_half pairing i <-> i + rotary_dim/2), cos/sin multiplied by attention_factor.
  // x is [tokens, heads, head_dim]; `positions` and `inv_freq` (rotary_dim/2 values) are host.
  virtual void rope(float* x, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                    std::span<const int32_t> positions, std::span<const float> inv_freq,
                    float attention_factor) = 0;
  // Stores k, v rows ([rows, num_kv_heads, head_dim]) of each slice at their cache positions
  // in `layer` of the pool.
  virtual void kv_write(KvPool& kv, int64_t layer, const float* k, const float* v,
                        std::span<const AttentionSlice> slices) = 0;
  // Causal attention over the pool: row i of a slice attends to positions
  // [0, start_pos + i] of that slice's pages. q and out are [rows, num_heads, head_dim].
  virtual void attention(KvPool& kv, int64_t layer, const float* q,
                         std::span<const AttentionSlice> slices, const AttentionShape& shape,
                         float* out) = 0;
  // out = silu(gate) * up over n elements (out may alias gate or up).
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // An MLP's down projection of its SwiGLU: y = matmul(silu(gate) * up, down), gate and up
  // [rows, down.cols]; gate is scratch afterwards. A backend may skip the product's f32 form
  // (the CUDA FP8 prefill GEMM quantizes it as it is computed); the results equal the two ops.
  virtual void swiglu_matmul(float* gate, const float* up, int64_t rows, const Weight& down, float* y) {
    swiglu(gate, up, rows * down.cols, gate);
    matmul(gate, rows, down, nullptr, y);
  }
  // y += x over n elements.
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // The residual add followed by the next RMSNorm: y += x, then normed = rms_norm(y) over rows
  // of cols (one launch on backends that fuse it; same results as the two ops).
  virtual void add_rms_norm(float* y, const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                            float* normed) {
    add(y, x, rows * cols);
    rms_norm(y, rows, cols, weight, eps, normed);
  }
  // add_rms_norm, then matmul_many of its output: one call, so that a backend may hand the norm's
  // output to the matmuls in their own operand format as it computes it (the CUDA FP8 prefill
  // GEMM's e4m3 codes). normed is written too; the results equal the two ops.
  virtual void add_rms_norm_matmul(float* y, const float* x, int64_t rows, int64_t cols, const float* weight,
                                   float eps, float* normed, std::span<const MatmulOutput> outputs) {
    add_rms_norm(y, x, rows, cols, weight, eps, normed);
    matmul_many(normed, rows, outputs);
  }
  // dst[i, :] = src[rows[i], :] for `cols`-wide rows; `rows` is host memory.
  virtual void gather_rows(const float* src, int64_t cols, std::span<const int32_t> rows,
                           float* dst) = 0;

  // --- memory for recurrent state (hybrid models) --------------------------------------
  // The backend owns state memory as it owns KV pages: models allocate their per-lane state
  // slots with alloc and clear a lane's slot with fill_zero when the lane is (re)assigned.
  // The defaults throw ("... is not implemented on <backend> yet").
  // x[0, n) = 0.
  virtual void fill_zero(float* x, int64_t n);
  // dst[0, n) = src[0, n), both backend memory (forking a lane's state).
  virtual void copy(float* dst, const float* src, int64_t n);

  // --- hybrid ops (Qwen3.5/3.6, model spec §2-§3) -----------------------------------------
  // Gated DeltaNet mixer of a batch of sequences, everything between the projections:
  //   mixed [rows, conv_channels] = in_proj_qkv(x): causal depthwise conv1d (carried conv
  //   state) + SiLU, split q | k | v, q and k L2-normalised per head (q also × dk^-0.5);
  //   b, a [rows, Hv]: beta = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias);
  //   the gated delta rule per value head with the fp32 ssm state (chunked or recurrent);
  //   then out [rows, Hv·dv] = norm_weight ⊙ rmsnorm(o per head) ⊙ silu(z), z [rows, Hv·dv].
  // mixed is overwritten (scratch). Each slice's conv and ssm states are read and updated, so
  // consecutive calls equal one call over the concatenated tokens. `slices` is host memory.
  virtual void gdn_mixer(const GdnShape& shape, const GdnLayerWeights& weights,
                         std::span<const GdnSlice> slices, float* mixed, const float* z,
                         const float* b, const float* a, float* out, GdnForm form = GdnForm::Auto);
  // gdn_mixer, then its output projection: y [rows, out_proj.rows] = out · out_proj^T (out is
  // scratch afterwards). A backend may skip out's f32 form (the CUDA FP8 prefill GEMM takes the
  // gated norm's values quantized as they are computed); the results equal the two ops.
  virtual void gdn_mixer_projected(const GdnShape& shape, const GdnLayerWeights& weights,
                                   std::span<const GdnSlice> slices, float* mixed, const float* z, const float* b,
                                   const float* a, float* out, const Weight& out_proj, float* y);
  // q_proj output [tokens, heads, 2·head_dim] → query and gate [tokens, heads, head_dim]: head
  // h's query is its first head_dim features, its gate the next head_dim (spec §2.3, §8.2).
  virtual void split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads,
                                int64_t head_dim, float* query, float* gate);
  // x[i] *= sigmoid(gate[i]) over n elements (the gated attention's output gate).
  virtual void sigmoid_mul(float* x, const float* gate, int64_t n);
  // y[r, :] += sigmoid(gate_logits[r]) · x[r, :] for r < rows (the MoE shared expert, gated by
  // one scalar per token).
  virtual void add_sigmoid_gated(float* y, const float* x, const float* gate_logits, int64_t rows,
                                 int64_t cols);
  // out[t, :] = Σ_k w[t, k] · down_e(silu(gate_e x[t]) ⊙ up_e x[t]) over the top_k experts e of
  // p = softmax(router_logits[t, :]) (fp32; ties to the lower id), w the chosen p, renormalised
  // when experts.renormalize. x [tokens, hidden], router_logits [tokens, num_experts], out
  // [tokens, hidden] (overwritten). A backend groups the (token, expert) pairs by expert.
  virtual void moe_experts(const float* x, int64_t tokens, int64_t hidden,
                           const float* router_logits, const MoeExperts& experts, float* out);
  // Allocates now the workspaces moe_experts will need for these experts, so that a KV pool
  // sized afterwards (--kv-capacity auto) leaves room for them. A no-op where there are none.
  virtual void reserve_moe_experts(const MoeExperts& experts) { (void)experts; }
  // out = the whole MoE MLP of x (router, moe_experts, the shared expert and its sigmoid gate,
  // summed as the separate ops would) in the backend's own fused form, where it has one for
  // this batch and these weights; returns false (and does nothing) otherwise, and the caller
  // runs the separate ops. The answer depends only on the shapes, formats and settings, not on
  // the step mode, so a dry step and its replay agree.
  virtual bool moe_mlp_fused(const float* x, int64_t tokens, int64_t hidden, const MoeMlp& mlp, float* out) {
    (void)x, (void)tokens, (void)hidden, (void)mlp, (void)out;
    return false;
  }
  // out[r, :] = [a[r, :] | b[r, :]] ([rows, a_cols + b_cols]; the MTP head's fc input).
  virtual void concat_columns(const float* a, int64_t a_cols, const float* b, int64_t b_cols,
                              int64_t rows, float* out);

  // --- sampling on the device (common/row_sampling.h) ---------------------------------------
  // Whether sample_rows is implemented; the default throws.
  virtual bool samples_on_device() const { return false; }
  // ids[r] (host memory) = the token the engine's Sampler picks from logits[r, :] with
  // batch.rows[r] and its draw, or kSampledNaN / kSampledNothing where the Sampler would throw,
  // for r < batch.rows.size(). logits [rows, vocab] is scratch. Returns once ids are written
  // (after every op enqueued before it).
  virtual void sample_rows(float* logits, int64_t vocab, const SamplingBatch& batch, int32_t* ids);
};

// The CPU backend; threads = 0 uses every core.
std::unique_ptr<Backend> make_cpu_backend(int threads);

// The CUDA backend on device `device` (builds with NINFER_WITH_CUDA only; throws when the
// device is missing).
std::unique_ptr<Backend> make_cuda_backend(int device);

// The backend a device string names: "cpu", "cuda" or "cuda:N".
std::unique_ptr<Backend> make_backend(const std::string& device, int threads);

}  // namespace ninfer
