// The CPU implementation of the Backend op set: f32 activations in host memory, weights used
// in place from the artifact mapping, work spread over a persistent thread pool.
#pragma once

#include <limits>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernels.h"
#include "common/thread_pool.h"

namespace ninfer::cpu {

// Softmax state of one query vector: its output is acc / sum, with scores taken relative to max.
struct OnlineSoftmax {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
};

// Rows [0, count) of kv head `kv_head` in one quantized page region, dequantized into `rows`
// ([count][head_dim] floats; cpu_kv_quant.cpp). Returns rows.data().
const float* dequantize_page_rows(KvPool& kv, int64_t layer, int32_t page, int which, int64_t kv_head, int64_t count,
                                  std::vector<float>& rows);

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);

  std::string name() const override { return "cpu"; }
  int threads() const { return pool_.size(); }

  Buffer alloc(int64_t elements) override;
  Weight upload_weight(const TensorView& tensor) override;
  Buffer upload_vector(const TensorView& tensor) override;
  void copy_from_host(float* dst, const float* src, int64_t elements) override;
  void copy_to_host(float* dst, const float* src, int64_t elements) override;
  void synchronize() override {}
  void bind_kv(KvPool& kv) override;
  Weight random_weight(int64_t rows, int64_t cols, uint64_t seed, float scale) override;
  Weight random_quantized_weight(DType dtype, int64_t rows, int64_t cols, int64_t group_rows, uint64_t seed,
                                 float scale) override;

  void matmul(const float* x, int64_t m, const Weight& w, const float* bias, float* y) override;
  void matmul_many(const float* x, int64_t m, std::span<const MatmulOutput> outputs) override;
  void embedding(const Weight& table, std::span<const int32_t> tokens, float* out) override;
  void rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                float* y) override;
  void rope(float* x, int64_t heads, int64_t head_dim, int64_t rotary_dim,
            std::span<const int32_t> positions, std::span<const float> inv_freq,
            float attention_factor) override;
  void kv_write(KvPool& kv, int64_t layer, const float* k, const float* v,
                std::span<const AttentionSlice> slices) override;
  void attention(KvPool& kv, int64_t layer, const float* q, std::span<const AttentionSlice> slices,
                 const AttentionShape& shape, float* out) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void add(float* y, const float* x, int64_t n) override;
  void gather_rows(const float* src, int64_t cols, std::span<const int32_t> rows,
                   float* dst) override;

  // Hybrid-model ops (cpu_hybrid.cpp), on the kernels of gdn_cpu, gated_attention_cpu, moe_cpu.
  void fill_zero(float* x, int64_t n) override;
  void copy(float* dst, const float* src, int64_t n) override;
  void gdn_mixer(const GdnShape& shape, const GdnLayerWeights& weights, std::span<const GdnSlice> slices,
                 float* mixed, const float* z, const float* b, const float* a, float* out,
                 GdnForm form) override;
  void split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim,
                        float* query, float* gate) override;
  void sigmoid_mul(float* x, const float* gate, int64_t n) override;
  void add_sigmoid_gated(float* y, const float* x, const float* gate_logits, int64_t rows,
                         int64_t cols) override;
  void moe_experts(const float* x, int64_t tokens, int64_t hidden, const float* router_logits,
                   const MoeExperts& experts, float* out) override;
  void concat_columns(const float* a, int64_t a_cols, const float* b, int64_t b_cols, int64_t rows,
                      float* out) override;

 private:
  // kv_write for a quantized pool: each token-head row quantized as cache/kv_format.h says.
  void kv_write_quantized(KvPool& kv, int64_t layer, const float* k, const float* v,
                          std::span<const AttentionSlice> slices);

  ThreadPool pool_;
  std::vector<BlockQ8Act> quantized_x_;  // scratch: activation rows quantized for q8_0 matmuls
  std::vector<float> partial_acc_;        // scratch: attention over split page ranges
  std::vector<OnlineSoftmax> partial_state_;
  std::vector<float> moe_rows_, moe_gate_, moe_up_, moe_out_;  // scratch: one expert's rows
  std::vector<std::shared_ptr<uint16_t>> random_weights_;      // bf16 storage random_weight made
  std::vector<std::shared_ptr<uint8_t>> random_quantized_;     // fp8/nvfp4 blobs random_quantized_weight made
};

}  // namespace ninfer::cpu
