// The CUDA implementation of the Backend op set for dense models on one device.
//
// Memory: weights live in one bump arena of large cudaMalloc chunks (uploaded once, every
// format converted to bf16), the KV pool in one bf16 allocation (Backend::bind_kv), and
// per-step scratch (bf16 copies of GEMM inputs, attention partials, step metadata) in
// buffers that only grow. Activations stay float32, as the Backend contract has them.
//
// Per-step metadata arrives as host spans; each kind (tokens, positions, KV slots, the
// attention plan, ...) is uploaded only when its bytes differ from the previous upload, so
// the per-layer calls of one step upload it once.
//
// Decode steps (Backend::run_step with graphable set) replay a CUDA graph captured once per
// step signature (cuda_step_graphs.cpp); prefill steps and anything uncapturable run eagerly.
//
// Matmul: bf16 weights, cuBLAS (resolved at run time) for larger m, a hand GEMV for m <= 16;
// in auto mode the first call of each small shape times both and keeps the faster.
//
// Kernel overlap (programmatic dependent launch, on unless NINFER_CUDA_PDL=0): the GEMVs and
// the norm/SwiGLU kernels between them are launched so that each may start before the previous
// kernel ends; a GEMV streams its first weights early and waits on the device before it reads
// x, so a decode step's matmuls run nearly back to back.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/attention_plan.h"
#include "backends/cuda/growing_buffer.h"
#include "backends/cuda/launchers.h"

namespace ninfer::cuda {

class Fp8BlockGemm;  // fp8_block_gemm.h
struct Fp8ActivationSink;  // launchers_fp8_prefill.h

// CUDA devices visible to this process (0 without a driver or device).
int device_count();

// Bumped by every growth of a DeviceScratch and every CudaBackend::alloc: captured step
// graphs hold device pointers, and one of them may have just been replaced.
uint64_t scratch_generation();

// False when the environment sets NINFER_CUDA_GRAPHS=0 (read at every step, so that a
// benchmark can time both in one process).
bool step_graphs_from_env();

// False when the environment sets NINFER_CUDA_PDL=0: kernels are then launched the ordinary
// way instead of overlapping the previous kernel (read at every step, like the graphs switch).
bool overlap_launches_from_env();

// Steps replayed as graphs by every CudaBackend of the process (tests check graphs are used).
uint64_t graph_replays_total();

// A device buffer that only grows (growing synchronizes the stream first).
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch();
  void* get(size_t bytes, cudaStream_t stream);
  // At least `bytes` now, allocated to the byte (get grows by half again for later growth).
  void reserve(size_t bytes, cudaStream_t stream);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host metadata mirrored on the device; re-uploaded only when the bytes change.
class MetadataSlot {
 public:
  const void* upload(const void* data, size_t bytes, cudaStream_t stream);
  template <typename T>
  const T* upload(std::span<const T> values, cudaStream_t stream) {
    return static_cast<const T*>(upload(values.data(), values.size_bytes(), stream));
  }

 private:
  std::vector<unsigned char> host_;
  bool valid_ = false;
  DeviceScratch device_;
};

class CudaBackend final : public Backend {
 public:
  enum class MatmulPath { Auto, Gemv, Cublas };
  enum class AttentionPath { Auto, Decode, Prefill };
  // How moe_experts runs the routed experts (cuda_backend_moe.cpp); Auto picks by batch size.
  enum class MoePath { Auto, Gemv, Grouped, Host };

  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  Buffer alloc(int64_t elements) override;
  Weight upload_weight(const TensorView& tensor) override;
  Buffer upload_vector(const TensorView& tensor) override;
  void copy_from_host(float* dst, const float* src, int64_t elements) override;
  void copy_to_host(float* dst, const float* src, int64_t elements) override;
  void synchronize() override;
  void run_step(bool graphable, const std::function<void()>& enqueue, int64_t variant = 0) override;
  void bind_kv(KvPool& kv) override;
  void kv_page_io(KvPool& kv, int32_t page, void* host, bool to_host) override;
  Weight random_weight(int64_t rows, int64_t cols, uint64_t seed, float scale) override;
  Weight random_quantized_weight(DType dtype, int64_t rows, int64_t cols, int64_t group_rows, uint64_t seed,
                                 float scale) override;

  void matmul(const float* x, int64_t m, const Weight& w, const float* bias, float* y) override;
  void matmul_many(const float* x, int64_t m, std::span<const MatmulOutput> outputs) override;
  void embedding(const Weight& table, std::span<const int32_t> tokens, float* out) override;
  void rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps, float* y) override;
  void head_rms_norm(const float* x, int64_t rows, int64_t head_dim, const float* weight, float eps,
                     float* y) override;
  void rope(float* x, int64_t heads, int64_t head_dim, int64_t rotary_dim, std::span<const int32_t> positions,
            std::span<const float> inv_freq, float attention_factor) override;
  void kv_write(KvPool& kv, int64_t layer, const float* k, const float* v,
                std::span<const AttentionSlice> slices) override;
  void attention(KvPool& kv, int64_t layer, const float* q, std::span<const AttentionSlice> slices,
                 const AttentionShape& shape, float* out) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void swiglu_matmul(float* gate, const float* up, int64_t rows, const Weight& down, float* y) override;
  void add(float* y, const float* x, int64_t n) override;
  void add_rms_norm(float* y, const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                    float* normed) override;
  void add_rms_norm_matmul(float* y, const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                           float* normed, std::span<const MatmulOutput> outputs) override;
  void gather_rows(const float* src, int64_t cols, std::span<const int32_t> rows, float* dst) override;

  // Hybrid models (cuda_backend_hybrid.cpp). gdn_mixer runs long prefill slices through the
  // chunked tensor-core delta rule and the rest token by token (state in registers).
  void fill_zero(float* x, int64_t n) override;
  void copy(float* dst, const float* src, int64_t n) override;
  void gdn_mixer(const GdnShape& shape, const GdnLayerWeights& weights, std::span<const GdnSlice> slices, float* mixed,
                 const float* z, const float* b, const float* a, float* out, GdnForm form) override;
  void gdn_mixer_projected(const GdnShape& shape, const GdnLayerWeights& weights, std::span<const GdnSlice> slices,
                           float* mixed, const float* z, const float* b, const float* a, float* out,
                           const Weight& out_proj, float* y) override;
  void split_query_gate(const float* q_proj_out, int64_t tokens, int64_t heads, int64_t head_dim, float* query,
                        float* gate) override;
  void sigmoid_mul(float* x, const float* gate, int64_t n) override;
  void add_sigmoid_gated(float* y, const float* x, const float* gate_logits, int64_t rows, int64_t cols) override;
  void moe_experts(const float* x, int64_t tokens, int64_t hidden, const float* router_logits,
                   const MoeExperts& experts, float* out) override;
  void concat_columns(const float* a, int64_t a_cols, const float* b, int64_t b_cols, int64_t rows,
                      float* out) override;
  // Decode batches (cuda_backend_moe_fused.cpp): router + top-k, the experts' gate/up and the
  // down projections with the weighted sum and the gated shared expert in three launches, any
  // of bf16/fp8/nvfp4 weights. Off with NINFER_MOE_FUSED=0 or a forced MoE path other than gemv.
  bool moe_mlp_fused(const float* x, int64_t tokens, int64_t hidden, const MoeMlp& mlp, float* out) override;

  // Sampling on the device (cuda_backend_sampling.cpp): one upload of the rows and lists, the
  // kernel, one download of the ids, one wait.
  bool samples_on_device() const override { return true; }
  void sample_rows(float* logits, int64_t vocab, const SamplingBatch& batch, int32_t* ids) override;

  // Test/benchmark controls: force a matmul path, an attention kernel, a split count (0 =
  // automatic) for the split-KV kernel, or the K/V buffering of the prefill kernel.
  void set_matmul_path(MatmulPath path) { matmul_path_ = path; }
  void set_attention_path(AttentionPath path) { attention_path_ = path; }
  void set_decode_splits(int splits) { forced_splits_ = splits; }
  void set_prefill_kernel(PrefillKernelConfig config) { prefill_kernel_ = config; }
  // Force a MoE expert path and, for the grouped one, its GEMM tile (MoeGroupedJob: rows
  // 32/64/128, columns 128/256; 0 = auto).
  void set_moe_path(MoePath path, int tile_rows = 0, int tile_cols = 0) {
    moe_path_ = path;
    moe_tile_rows_ = tile_rows;
    moe_tile_cols_ = tile_cols;
  }
  bool cublas_available() const { return cublas_ != nullptr; }
  // Decode step graphs (cuda_step_graphs.cpp); on unless this is off or NINFER_CUDA_GRAPHS=0.
  void set_step_graphs(bool on) { step_graphs_ = on; }
  // Blocks per row of the sampling kernel: 1, 2, 4, 8 or 16; 0 = by vocabulary size.
  void set_sample_cluster_blocks(int blocks) { sample_cluster_blocks_ = blocks; }

 private:
  void activate() const;
  void* arena_alloc(size_t bytes);
  void run_gemv(const float* x, int64_t m, std::span<const MatmulOutput> outputs);
  void run_cublas(const float* x, int64_t m, std::span<const MatmulOutput> outputs);
  // The cuBLAS GEMMs of run_cublas on x already in bf16 (xb [m, k]).
  void run_cublas_bf16(const uint16_t* xb, int64_t m, std::span<const MatmulOutput> outputs);
  bool prefer_gemv(const float* x, int64_t m, std::span<const MatmulOutput> outputs);
  KvLayout kv_layout(const KvPool& kv, int64_t layer) const;
  // FP8/NVFP4 weights (cuda_backend_quant.cpp).
  Weight upload_quantized(const TensorView& tensor, int64_t rows, int64_t cols);
  // x_quantized: the FP8 GEMM's activations already hold x (a producer wrote them).
  void matmul_quantized(const float* x, int64_t m, std::span<const MatmulOutput> outputs, bool x_quantized = false);
  // gdn_mixer; with norm_sink (gated_rmsnorm_to_fp8_fits checked), its last step writes
  // norm_sink's FP8 operand instead of out (out then keeps the delta rule's output).
  void gdn_mixer_into(const GdnShape& shape, const GdnLayerWeights& weights, std::span<const GdnSlice> slices,
                      float* mixed, const float* z, const float* b, const float* a, float* out, GdnForm form,
                      const Fp8ActivationSink* norm_sink);
  // gdn_mixer's last step: the gated norm of the delta rule's output (out, in place), or, with
  // norm_sink, the same values written as norm_sink's FP8 operand.
  void finish_gdn_norm(float* out, const float* z, int64_t rows, const GdnShape& shape, const float* norm_weight,
                       const Fp8ActivationSink* norm_sink, bool overlap);
  // The FP8 prefill GEMM when it takes w for m rows (and cuBLASLt loaded), else null.
  Fp8BlockGemm* fp8_gemm_taking(const Weight& w, int64_t m);
  MoePath moe_path_for(int64_t pairs, int64_t hidden, const MoeExperts& experts) const;
  // Quantized expert stacks: the routed experts through the fused decode kernels (ids already
  // routed), or both stacks dequantized into bf16 scratch for the grouped and host paths.
  bool moe_experts_quantized_gemv(const float* x, int64_t tokens, int64_t hidden, const int32_t* ids_dev,
                                  const float* route_weights, const MoeExperts& experts, float* out);
  MoeExperts moe_experts_as_bf16(const MoeExperts& experts);
  void reserve_moe_experts(const MoeExperts& experts) override;
  void moe_experts_routed(const float* x, int64_t tokens, int64_t hidden, MoePath path, const int32_t* ids_dev,
                          const float* route_weights, const MoeExperts& experts, float* out);
  void moe_experts_on_host_plan(const float* x, int64_t tokens, int64_t hidden, const int32_t* ids_dev,
                                const float* route_weights, const MoeExperts& experts, float* out);

  // Step graphs (cuda_step_graphs.cpp). run_step first runs a step "dry": the ops compute and
  // stage their metadata and note their host-side launch choices (the step's signature) but
  // launch nothing. A signature seen before with a graph replays it after copying the staged
  // metadata into its pinned buffers; one seen once (scratch grown, GEMV timings cached) is
  // captured; a new one runs eagerly. Ops call stage() instead of MetadataSlot::upload,
  // note() for launch parameters that are not in the staged sizes, and return after staging
  // when dry().
  enum class StepMode { Eager, Dry, Capture };
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t done = nullptr;       // recorded after each launch: the pinned buffers are free
    std::vector<void*> host, device;  // per upload: pinned staging and its device copy
    std::vector<size_t> bytes;
    StepGraph() = default;
    StepGraph(const StepGraph&) = delete;
    StepGraph& operator=(const StepGraph&) = delete;
    ~StepGraph();
  };
  bool dry() const { return mode_ == StepMode::Dry; }
  const void* stage(MetadataSlot& slot, const void* data, size_t bytes);
  template <typename T>
  const T* stage(MetadataSlot& slot, std::span<const T> values) {
    return static_cast<const T*>(stage(slot, values.data(), values.size_bytes()));
  }
  void note(int64_t value) {
    if (mode_ == StepMode::Dry) signature_.push_back(value);
  }
  void not_graphable() {
    if (mode_ == StepMode::Dry) step_graphable_ = false;
  }
  void capture_and_launch(const std::function<void()>& enqueue);
  void launch_graph(StepGraph& graph);

  int device_ = 0;
  int num_sms_ = 132;
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;

  struct Chunk {
    void* ptr;
    size_t size;
    size_t used;
  };
  std::vector<Chunk> arena_;

  DeviceScratch x_bf16_, partials_;
  DeviceScratch w_bf16_;  // a quantized weight dequantized for a prefill GEMM
  std::shared_ptr<Fp8BlockGemm> fp8_gemm_;  // FP8 prefill GEMMs (made at first use; null without cuBLASLt)
  bool fp8_gemm_tried_ = false;
  void* gemv_memory_ = nullptr;  // the GEMV's workspace (zeroed once, reused by every launch)
  GemvWorkspace gemv_workspace_;
  MetadataSlot tokens_, positions_, inv_freq_, kv_slots_, attention_plan_, gather_rows_;
  // hybrid-model scratch and metadata
  DeviceScratch gdn_conv_out_, gdn_gates_, gdn_chunk_workspace_, moe_route_, moe_x_, moe_gate_, moe_up_, moe_y_,
      moe_grouped_;
  MetadataSlot gdn_seqs_, moe_plan_;
  DeviceScratch moe_fused_route_, moe_fused_act_, moe_bf16_gate_up_, moe_bf16_down_;
  // The routing kernel's per-token arrival counters: zeroed when first allocated, left at 0 by
  // every launch (so a graph replays them as captured).
  DeviceScratch moe_route_arrivals_;
  void* moe_route_arrivals_zeroed_ = nullptr;
  // sample_rows: the packed batch and the ids, staged in pinned memory and mirrored on the device
  GrowingBuffer sampling_host_{GrowingBuffer::Where::PinnedHost}, sampling_device_{GrowingBuffer::Where::Device};
  int sample_cluster_blocks_ = 0;

  MatmulPath matmul_path_ = MatmulPath::Auto;
  AttentionPath attention_path_ = AttentionPath::Auto;
  int forced_splits_ = 0;
  PrefillKernelConfig prefill_kernel_;
  MoePath moe_path_ = MoePath::Auto;
  int moe_tile_rows_ = 0;
  int moe_tile_cols_ = 0;
  std::map<std::vector<int64_t>, bool> gemv_faster_;  // (m, k, rows...) -> the GEMV won the timing

  bool step_graphs_ = true;
  bool overlap_launches_ = true;  // launch GEMVs, norms and SwiGLU overlapping the previous kernel
  int gemv_variant_ = -1;         // NINFER_GEMV_VARIANT: one bf16 GEMV variant for every launch
  StepMode mode_ = StepMode::Eager;
  bool step_graphable_ = true;
  std::vector<int64_t> signature_;                     // the dry step's launch choices and sizes
  std::vector<std::vector<unsigned char>> staged_;     // the dry step's metadata, upload by upload
  std::vector<int64_t> stage_choice_;                  // per stage() call: the upload it uses
  std::map<const MetadataSlot*, size_t> slot_last_;    // slot -> its latest upload this step
  size_t stage_cursor_ = 0;                            // capture: the next stage() call
  StepGraph* capturing_ = nullptr;
  std::map<std::vector<int64_t>, std::unique_ptr<StepGraph>> graphs_;
  std::set<std::vector<int64_t>> seen_, uncapturable_;
  uint64_t graphs_generation_ = 0;                     // scratch_generation() the graphs were made at
};

}  // namespace ninfer::cuda
