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
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace ninfer {

class KvPool;
struct TensorView;

// A weight matrix [rows, cols] (row-major, cols contiguous) resident on the backend.
// For Q8_0, cols counts logical elements and each row is cols/32 blocks of 34 bytes.
struct Weight {
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
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
  virtual void synchronize() = 0;
  // Attaches page storage in this backend's memory to the pool unless it has some already;
  // throws if the pool's storage lives elsewhere. Models call it once at load; kv_write and
  // attention call it too, so a pool built by hand works as well.
  virtual void bind_kv(KvPool& kv) = 0;
  // A [rows, cols] weight of seeded pseudo-random values, uniform in [-scale, scale], made in
  // backend memory (benchmarks of real shapes without a weight file). Optional.
  virtual Weight random_weight(int64_t rows, int64_t cols, uint64_t seed, float scale);

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
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight (x may equal y).
  virtual void rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                        float* y) = 0;
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
  // y += x over n elements.
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // dst[i, :] = src[rows[i], :] for `cols`-wide rows; `rows` is host memory.
  virtual void gather_rows(const float* src, int64_t cols, std::span<const int32_t> rows,
                           float* dst) = 0;
};

// The CPU backend; threads = 0 uses every core.
std::unique_ptr<Backend> make_cpu_backend(int threads);

// The CUDA backend on device `device` (builds with NINFER_WITH_CUDA only; throws when the
// device is missing).
std::unique_ptr<Backend> make_cuda_backend(int device);

// The backend a device string names: "cpu", "cuda" or "cuda:N".
std::unique_ptr<Backend> make_backend(const std::string& device, int threads);

}  // namespace ninfer
