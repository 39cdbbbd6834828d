#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "artifact/artifact.h"
#include "backends/cuda/cublas_runtime.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/host_convert.h"
#include "backends/cuda/launchers_hybrid.h"
#include "cache/kv_pool.h"

namespace ninfer {

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<cuda::CudaBackend>(device); }

namespace cuda {

namespace {

constexpr size_t kArenaChunk = size_t(256) << 20;  // weights are packed into chunks this large
constexpr size_t kAlign = 256;
constexpr int kPrefillMinRows = 16;  // slices with this many new tokens use the tensor-core kernel

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

void check_slice(const AttentionSlice& s, const KvPool& kv) {
  const int64_t end = static_cast<int64_t>(s.start_pos) + s.num_tokens;
  if (s.start_pos < 0 || s.num_tokens < 0 || s.row_begin < 0 || (end + kPageTokens - 1) / kPageTokens > s.num_pages)
    throw std::invalid_argument("attention slice at position " + std::to_string(s.start_pos) + " with " +
                                std::to_string(s.num_tokens) + " tokens needs more than its " +
                                std::to_string(s.num_pages) + " pages");
  for (int32_t p = 0; p < s.num_pages; ++p)
    if (s.page_table[p] < 0 || s.page_table[p] >= kv.num_pages())
      throw std::out_of_range("page id " + std::to_string(s.page_table[p]) + " is outside the KV pool");
}

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error of a machine without a driver
    return 0;
  }
  return count;
}

// --- scratch and metadata ---------------------------------------------------------------------

namespace {
std::atomic<uint64_t> scratch_moves{0};
}  // namespace

uint64_t scratch_generation() { return scratch_moves.load(); }

DeviceScratch::~DeviceScratch() {
  if (ptr_) cudaFree(ptr_);
}

void* DeviceScratch::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_ && ptr_) return ptr_;
  reserve(bytes + bytes / 2, stream);
  return ptr_;
}

void DeviceScratch::reserve(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_ && ptr_) return;
  if (ptr_) {
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));  // kernels may still read the old buffer
    NINFER_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    ++scratch_moves;
  }
  const size_t size = align_up(std::max<size_t>(bytes, 4096), kAlign);
  NINFER_CUDA_CHECK(cudaMalloc(&ptr_, size));
  bytes_ = size;
}

const void* MetadataSlot::upload(const void* data, size_t bytes, cudaStream_t stream) {
  if (valid_ && bytes == host_.size() && (bytes == 0 || std::memcmp(data, host_.data(), bytes) == 0))
    return device_.get(std::max<size_t>(bytes, 1), stream);
  host_.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + bytes);
  void* dst = device_.get(std::max<size_t>(bytes, 1), stream);
  // Stream-ordered after every kernel that read the previous contents. From pageable memory
  // the copy is staged before the call returns, so host_ may change afterwards.
  if (bytes) NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, host_.data(), bytes, cudaMemcpyHostToDevice, stream));
  valid_ = true;
  return dst;
}

// --- lifetime and memory ----------------------------------------------------------------------

CudaBackend::CudaBackend(int device) : device_(device) {
  const int count = device_count();
  if (device < 0 || device >= count)
    throw std::runtime_error("CUDA device " + std::to_string(device) + " is not available (" + std::to_string(count) +
                             " visible)");
  activate();
  NINFER_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (CublasRuntime::get().available()) cublas_ = CublasRuntime::get().create_handle(stream_);
  const int64_t gemv_blocks = gemv_workspace_blocks(num_sms_);
  NINFER_CUDA_CHECK(cudaMalloc(&gemv_memory_, gemv_workspace_bytes(gemv_blocks)));
  NINFER_CUDA_CHECK(cudaMemsetAsync(gemv_memory_, 0, gemv_workspace_bytes(gemv_blocks), stream_));
  gemv_workspace_ = gemv_workspace_at(gemv_memory_, gemv_blocks);
  overlap_launches_ = overlap_launches_from_env();
  // NINFER_CUDA_MATMUL=gemv|cublas fixes the matmul path (tests that compare two backends
  // exactly; the timed auto choice may differ between them).
  if (const char* path = std::getenv("NINFER_CUDA_MATMUL")) {
    if (std::strcmp(path, "gemv") == 0) matmul_path_ = MatmulPath::Gemv;
    if (std::strcmp(path, "cublas") == 0) matmul_path_ = MatmulPath::Cublas;
  }
  // NINFER_GEMV_VARIANT=i: every bf16 GEMV of this backend runs variant i (tests, timings).
  if (const char* v = std::getenv("NINFER_GEMV_VARIANT")) {
    const int i = std::atoi(v);
    gemv_variant_ = i >= 0 && i < gemv_variant_count() ? i : -1;
  }
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  graphs_.clear();
  fp8_gemm_.reset();  // before the stream it runs on
  if (cublas_) CublasRuntime::get().destroy_handle(cublas_);
  if (gemv_memory_) cudaFree(gemv_memory_);
  for (const auto& chunk : arena_) cudaFree(chunk.ptr);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::activate() const { NINFER_CUDA_CHECK(cudaSetDevice(device_)); }

void* CudaBackend::arena_alloc(size_t bytes) {
  bytes = align_up(std::max<size_t>(bytes, 1), kAlign);
  for (auto& chunk : arena_)
    if (chunk.size - chunk.used >= bytes) {
      void* p = static_cast<char*>(chunk.ptr) + chunk.used;
      chunk.used += bytes;
      return p;
    }
  const size_t size = std::max(bytes, kArenaChunk);
  void* p = nullptr;
  NINFER_CUDA_CHECK(cudaMalloc(&p, size));
  arena_.push_back({p, size, bytes});
  return p;
}

Buffer CudaBackend::alloc(int64_t elements) {
  if (elements < 0) throw std::invalid_argument("CudaBackend::alloc: negative size");
  activate();
  void* p = nullptr;
  NINFER_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(elements, 1)) * sizeof(float)));
  ++scratch_moves;  // e.g. a model's logits buffer grew: graphs may hold the one it replaces
  const int device = device_;
  return Buffer(std::shared_ptr<float>(static_cast<float*>(p),
                                       [device](float* q) {
                                         cudaSetDevice(device);
                                         cudaFree(q);
                                       }),
                elements);
}

Weight CudaBackend::upload_weight(const TensorView& t) {
  if (t.shape.empty() || t.shape.size() > 2)
    throw std::runtime_error("tensor '" + t.name + "': a weight must be 1-D or 2-D");
  if (t.dtype == DType::I32) throw std::runtime_error("tensor '" + t.name + "': i32 is not a weight format");
  const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = t.shape.back();
  if (is_block_quantized(t.dtype)) return upload_quantized(t, rows, cols);
  if (t.dtype == DType::Q8_0 && cols % kQ8BlockSize != 0)
    throw std::runtime_error("tensor '" + t.name + "': q8_0 rows must be a multiple of 32");
  if (static_cast<uint64_t>(row_bytes(t.dtype, cols) * rows) != t.nbytes)
    throw std::runtime_error("tensor '" + t.name + "': byte size does not match its shape");
  activate();
  auto* dst = static_cast<uint16_t*>(arena_alloc(static_cast<size_t>(rows * cols) * 2));
  if (t.dtype == DType::BF16) {
    NINFER_CUDA_CHECK(cudaMemcpy(dst, t.data, t.nbytes, cudaMemcpyHostToDevice));
  } else {
    // Convert in row blocks of about 16 M elements so host memory stays bounded.
    const int64_t block_rows = std::max<int64_t>(1, (int64_t(1) << 24) / std::max<int64_t>(cols, 1));
    std::vector<float> f32(static_cast<size_t>(std::min(rows, block_rows) * cols));
    std::vector<uint16_t> bf16(f32.size());
    const int64_t stride = row_bytes(t.dtype, cols);
    for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
      const int64_t n = std::min(block_rows, rows - r0);
      for (int64_t r = 0; r < n; ++r)
        row_to_f32(t.dtype, static_cast<const uint8_t*>(t.data) + (r0 + r) * stride, cols, f32.data() + r * cols);
      for (int64_t i = 0; i < n * cols; ++i) bf16[static_cast<size_t>(i)] = f32_to_bf16_bits(f32[static_cast<size_t>(i)]);
      NINFER_CUDA_CHECK(cudaMemcpy(dst + r0 * cols, bf16.data(), static_cast<size_t>(n * cols) * 2, cudaMemcpyHostToDevice));
    }
  }
  return Weight{DType::BF16, rows, cols, dst};
}

Buffer CudaBackend::upload_vector(const TensorView& t) {
  if (t.shape.size() != 1) throw std::runtime_error("tensor '" + t.name + "': expected a 1-D tensor");
  if (t.dtype == DType::I32) throw std::runtime_error("tensor '" + t.name + "': i32 is not a weight format");
  const int64_t n = t.shape[0];
  if (static_cast<uint64_t>(row_bytes(t.dtype, n)) != t.nbytes)
    throw std::runtime_error("tensor '" + t.name + "': byte size does not match its shape");
  std::vector<float> host(static_cast<size_t>(n));
  row_to_f32(t.dtype, t.data, n, host.data());
  Buffer out = alloc(n);
  NINFER_CUDA_CHECK(cudaMemcpy(out.data(), host.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
  return out;
}

void CudaBackend::copy_from_host(float* dst, const float* src, int64_t n) {
  not_graphable();  // a copy from pageable memory cannot be captured
  if (dry()) return;
  activate();
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::copy_to_host(float* dst, const float* src, int64_t n) {
  activate();
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() {
  activate();
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::bind_kv(KvPool& kv) {
  const std::string where = "cuda:" + std::to_string(device_);
  if (kv.has_storage()) {
    if (kv.storage().device != where || kv.storage().dtype != DType::BF16)
      throw std::invalid_argument("the KV pool's storage is " + std::string(dtype_name(kv.storage().dtype)) + " on " +
                                  kv.storage().device + "; the CUDA backend needs bf16 on " + where);
    return;
  }
  if (!attention_head_dim_supported(kv.head_dim()))
    throw std::invalid_argument("CUDA attention: head_dim " + std::to_string(kv.head_dim()) +
                                " is not supported (64, 128 or 256)");
  activate();
  size_t free_bytes = 0, total_bytes = 0;
  NINFER_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  kv.resolve_size(static_cast<int64_t>(free_bytes), 2);  // a quantized pool counts its own page bytes
  const auto bytes = static_cast<size_t>(kv.storage_bytes(2));
  void* p = nullptr;
  NINFER_CUDA_CHECK(cudaMalloc(&p, bytes));
  NINFER_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  const int device = device_;
  kv.attach_storage({std::shared_ptr<void>(p,
                                           [device](void* q) {
                                             cudaSetDevice(device);
                                             cudaFree(q);
                                           }),
                     DType::BF16, where});
}

void CudaBackend::kv_page_io(KvPool& kv, int32_t page, void* host, bool to_host) {
  bind_kv(kv);
  if (page < 0 || page >= kv.num_pages()) throw std::out_of_range("kv_page_io: page outside the pool");
  activate();
  const auto piece = static_cast<size_t>(kv.region_bytes(2));  // bf16 elements or a quantized region
  auto* base = static_cast<std::byte*>(kv.storage().memory.get());
  auto* at = static_cast<std::byte*>(host);
  for (int64_t layer = 0; layer < kv.num_layers(); ++layer)
    for (int which = 0; which < 2; ++which, at += piece) {
      std::byte* stored = base + kv.region_offset(layer, page, which, 2);
      NINFER_CUDA_CHECK(cudaMemcpyAsync(to_host ? static_cast<void*>(at) : static_cast<void*>(stored),
                                        to_host ? static_cast<const void*>(stored) : static_cast<const void*>(at),
                                        piece, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream_));
    }
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

Weight CudaBackend::random_weight(int64_t rows, int64_t cols, uint64_t seed, float scale) {
  if (rows <= 0 || cols <= 0) throw std::invalid_argument("random_weight: rows and cols must be positive");
  activate();
  auto* dst = static_cast<uint16_t*>(arena_alloc(static_cast<size_t>(rows * cols) * 2));
  launch_random_bf16(dst, rows * cols, seed, scale, stream_);
  return Weight{DType::BF16, rows, cols, dst};
}

// --- matmul ---------------------------------------------------------------------------------

void CudaBackend::matmul(const float* x, int64_t m, const Weight& w, const float* bias, float* y) {
  const MatmulOutput output{&w, bias, y};
  matmul_many(x, m, std::span(&output, 1));
}

void CudaBackend::run_gemv(const float* x, int64_t m, std::span<const MatmulOutput> outputs) {
  const int64_t k = outputs[0].weight->cols;
  for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kGemvMaxRows, m - r0));
    for (size_t j0 = 0; j0 < outputs.size(); j0 += kGemvMaxJobs) {
      GemvJob jobs[kGemvMaxJobs];
      int n = 0;
      for (size_t j = j0; j < outputs.size() && n < kGemvMaxJobs; ++j, ++n) {
        const MatmulOutput& o = outputs[j];
        jobs[n] = {static_cast<const uint16_t*>(o.weight->data), o.bias, o.y + r0 * o.weight->rows,
                   static_cast<int32_t>(o.weight->rows)};
      }
      launch_gemv_bf16(jobs, n, x + r0 * k, rows, static_cast<int>(k),
                       {.workspace = gemv_workspace_, .overlap_previous = overlap_launches_, .variant = gemv_variant_},
                       stream_);
    }
  }
}

void CudaBackend::run_cublas(const float* x, int64_t m, std::span<const MatmulOutput> outputs) {
  const int64_t k = outputs[0].weight->cols;
  auto* xb = static_cast<uint16_t*>(x_bf16_.get(static_cast<size_t>(m * k) * 2, stream_));
  launch_f32_to_bf16(x, xb, m * k, stream_);
  run_cublas_bf16(xb, m, outputs);
}

void CudaBackend::run_cublas_bf16(const uint16_t* xb, int64_t m, std::span<const MatmulOutput> outputs) {
  const int64_t k = outputs[0].weight->cols;
  for (const auto& o : outputs) {
    CublasRuntime::get().gemm_bf16_rowmajor(cublas_, xb, o.weight->data, o.y, static_cast<int>(m),
                                            static_cast<int>(o.weight->rows), static_cast<int>(k));
    if (o.bias) launch_add_bias(o.y, o.bias, m, o.weight->rows, stream_);
  }
}

bool CudaBackend::prefer_gemv(const float* x, int64_t m, std::span<const MatmulOutput> outputs) {
  const int64_t k = outputs[0].weight->cols;
  const bool gemv_ok = k % 8 == 0;
  if (!cublas_) {
    if (!gemv_ok) throw std::runtime_error("matmul: cuBLAS is unavailable and k is not a multiple of 8");
    return true;
  }
  if (!gemv_ok || matmul_path_ == MatmulPath::Cublas) return false;
  if (matmul_path_ == MatmulPath::Gemv) return true;
  if (m > kGemvMaxRows) return false;
  std::vector<int64_t> key{m, k};
  for (const auto& o : outputs) key.push_back(o.weight->rows);
  if (auto it = gemv_faster_.find(key); it != gemv_faster_.end()) return it->second;
  // First call of this shape: time both paths (they write the same outputs) and keep the faster.
  cudaEvent_t start, stop;
  NINFER_CUDA_CHECK(cudaEventCreate(&start));
  NINFER_CUDA_CHECK(cudaEventCreate(&stop));
  float best[2] = {0.0f, 0.0f};
  for (int path = 0; path < 2; ++path) {
    auto run = [&] { path == 0 ? run_gemv(x, m, outputs) : run_cublas(x, m, outputs); };
    run();  // warm-up (and cuBLAS heuristics)
    NINFER_CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int i = 0; i < 5; ++i) run();
    NINFER_CUDA_CHECK(cudaEventRecord(stop, stream_));
    NINFER_CUDA_CHECK(cudaEventSynchronize(stop));
    NINFER_CUDA_CHECK(cudaEventElapsedTime(&best[path], start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return gemv_faster_[key] = best[0] <= best[1];
}

void CudaBackend::matmul_many(const float* x, int64_t m, std::span<const MatmulOutput> outputs) {
  if (outputs.empty() || m <= 0) return;
  if (std::any_of(outputs.begin(), outputs.end(), [](const MatmulOutput& o) { return is_block_quantized(o.weight->dtype); })) {
    // bf16 and quantized weights of one call (a mixed-precision checkpoint) go their own ways.
    std::vector<MatmulOutput> plain, quantized;
    for (const auto& o : outputs) (is_block_quantized(o.weight->dtype) ? quantized : plain).push_back(o);
    if (!plain.empty()) matmul_many(x, m, plain);
    matmul_quantized(x, m, quantized);
    return;
  }
  const int64_t k = outputs[0].weight->cols;
  for (const auto& o : outputs) {
    if (o.weight->dtype != DType::BF16)
      throw std::invalid_argument("CUDA matmul: weights must be uploaded by this backend (bf16)");
    if (o.weight->cols != k) throw std::invalid_argument("matmul_many: all weights need the same width");
  }
  activate();
  if (dry()) {
    // A shape not yet timed would launch the timing runs: run this step eagerly.
    std::vector<int64_t> key{m, k};
    for (const auto& o : outputs) key.push_back(o.weight->rows);
    if (cublas_ && matmul_path_ == MatmulPath::Auto && k % 8 == 0 && m <= kGemvMaxRows && !gemv_faster_.count(key))
      not_graphable();
    else
      note(prefer_gemv(x, m, outputs));
    note(overlap_launches_);
    return;
  }
  if (prefer_gemv(x, m, outputs))
    run_gemv(x, m, outputs);
  else
    run_cublas(x, m, outputs);
}

// --- elementwise ------------------------------------------------------------------------------

void CudaBackend::embedding(const Weight& table, std::span<const int32_t> tokens, float* out) {
  if (table.dtype != DType::BF16) throw std::invalid_argument("CUDA embedding: the table must be a bf16 weight");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= table.rows)
      throw std::out_of_range("token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                              std::to_string(table.rows) + ")");
  activate();
  const int32_t* ids = stage(tokens_, tokens);
  if (dry()) return;
  launch_embedding(static_cast<const uint16_t*>(table.data), table.cols, ids, static_cast<int64_t>(tokens.size()), out,
                   stream_);
}

void CudaBackend::rms_norm(const float* x, int64_t rows, int64_t cols, const float* weight, float eps, float* y) {
  if (dry()) return;
  activate();
  launch_rms_norm(x, rows, cols, weight, eps, y, stream_, overlap_launches_);
}

void CudaBackend::head_rms_norm(const float* x, int64_t rows, int64_t head_dim, const float* weight, float eps,
                                float* y) {
  if (!head_rms_norm_fits(head_dim)) return rms_norm(x, rows, head_dim, weight, eps, y);
  if (dry()) return;
  activate();
  launch_head_rms_norm(x, rows, head_dim, weight, eps, y, stream_, overlap_launches_);
}

void CudaBackend::rope(float* x, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                       std::span<const int32_t> positions, std::span<const float> inv_freq, float attention_factor) {
  if (rotary_dim % 2 != 0 || rotary_dim > head_dim || static_cast<int64_t>(inv_freq.size()) != rotary_dim / 2)
    throw std::invalid_argument("rope: rotary_dim must be even, <= head_dim, and match inv_freq");
  activate();
  const int32_t* pos = stage(positions_, positions);
  const float* freq = stage(inv_freq_, inv_freq);
  if (dry()) return;
  launch_rope(x, static_cast<int64_t>(positions.size()), heads, head_dim, rotary_dim, pos, freq, attention_factor,
              stream_);
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  if (dry()) return;
  activate();
  launch_swiglu(gate, up, n, out, stream_, overlap_launches_);
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  if (dry()) return;
  activate();
  launch_add(y, x, n, stream_);
}

void CudaBackend::add_rms_norm(float* y, const float* x, int64_t rows, int64_t cols, const float* weight, float eps,
                               float* normed) {
  if (normed == y || normed == x) {  // the fused kernel reads y and x while writing normed
    Backend::add_rms_norm(y, x, rows, cols, weight, eps, normed);
    return;
  }
  if (dry()) return;
  activate();
  launch_add_rms_norm(y, x, rows, cols, weight, eps, normed, stream_, overlap_launches_);
}

void CudaBackend::gather_rows(const float* src, int64_t cols, std::span<const int32_t> rows, float* dst) {
  for (const int32_t r : rows)
    if (r < 0) throw std::out_of_range("gather_rows: negative row index");
  activate();
  const int32_t* ids = stage(gather_rows_, rows);
  if (dry()) return;
  launch_gather_rows(src, cols, ids, static_cast<int64_t>(rows.size()), dst, stream_);
}

// --- KV cache and attention -------------------------------------------------------------------

KvLayout CudaBackend::kv_layout(const KvPool& kv, int64_t layer) const {
  if (layer < 0 || layer >= kv.num_layers())
    throw std::out_of_range("layer " + std::to_string(layer) + " is outside the KV pool");
  KvLayout layout{kv.storage().memory.get(), kv.num_pages(), kv.page_elems(), static_cast<int32_t>(kv.num_kv_heads()),
                  static_cast<int32_t>(layer)};
  if (kv.quantized()) {
    const KvRegion region = kv.region();
    layout.kv_dtype = static_cast<int32_t>(kv.kv_dtype());
    layout.region_bytes = region.bytes;
    layout.groups_offset = region.groups_offset;
    layout.scales_offset = region.scales_offset;
  }
  return layout;
}

void CudaBackend::kv_write(KvPool& kv, int64_t layer, const float* k, const float* v,
                           std::span<const AttentionSlice> slices) {
  bind_kv(kv);
  int64_t rows = 0;
  for (const auto& s : slices) {
    check_slice(s, kv);
    rows = std::max<int64_t>(rows, static_cast<int64_t>(s.row_begin) + s.num_tokens);
  }
  std::vector<int32_t> slots(static_cast<size_t>(rows), -1);  // -1: a row no slice writes
  for (const auto& s : slices)
    for (int32_t i = 0; i < s.num_tokens; ++i) {
      const int64_t pos = static_cast<int64_t>(s.start_pos) + i;
      slots[static_cast<size_t>(s.row_begin + i)] =
          static_cast<int32_t>(s.page_table[pos / kPageTokens] * kPageTokens + pos % kPageTokens);
    }
  activate();
  const int32_t* device_slots = stage(kv_slots_, std::span<const int32_t>(slots));
  if (dry()) return;
  launch_kv_write(kv_layout(kv, layer), kv.head_dim(), k, v, device_slots, rows, stream_);
}

void CudaBackend::attention(KvPool& kv, int64_t layer, const float* q, std::span<const AttentionSlice> slices,
                            const AttentionShape& shape, float* out) {
  bind_kv(kv);
  const int64_t hd = shape.head_dim, nh = shape.num_heads, nkv = shape.num_kv_heads;
  if (nkv <= 0 || nh % nkv != 0 || hd != kv.head_dim() || nkv != kv.num_kv_heads())
    throw std::invalid_argument("attention: head counts/dims do not match the KV pool");
  for (const auto& s : slices) check_slice(s, kv);

  // The plan: every slice's page table, then split-KV items (single rows) and prefill items.
  std::vector<int32_t> pages;
  std::vector<DecodeItem> decode;
  std::vector<PrefillItem> prefill;
  int32_t max_len = 0;
  for (const auto& s : slices) {
    const auto offset = static_cast<int32_t>(pages.size());
    pages.insert(pages.end(), s.page_table, s.page_table + s.num_pages);
    const bool use_prefill = attention_path_ == AttentionPath::Prefill ||
                             (attention_path_ == AttentionPath::Auto && s.num_tokens >= kPrefillMinRows);
    if (use_prefill) {
      for (int32_t r = 0; r < s.num_tokens; r += kPrefillBlockRows)
        prefill.push_back({s.row_begin + r, std::min(kPrefillBlockRows, s.num_tokens - r), s.start_pos + r, offset});
    } else {
      for (int32_t r = 0; r < s.num_tokens; ++r) {
        decode.push_back({s.row_begin + r, s.start_pos + r + 1, offset, 0});
        max_len = std::max(max_len, s.start_pos + r + 1);
      }
    }
  }
  std::reverse(prefill.begin(), prefill.end());  // longest rows (latest blocks) start first

  int splits = 1, chunk = 0;
  if (!decode.empty()) {
    // Splits are chosen for the page count rounded up to a power of two, so that a step graph
    // (which fixes them) serves a whole range of lengths; splits past a row's keys are empty.
    const int64_t max_pages = std::bit_ceil(static_cast<uint64_t>((max_len + kPageTokens - 1) / kPageTokens));
    const int64_t group_chunks = (nh / nkv + 7) / 8;
    const int64_t base_blocks = static_cast<int64_t>(decode.size()) * nkv * group_chunks;
    // Enough blocks (about 8 per SM) that many K/V loads are in flight across the chip.
    int64_t want = forced_splits_ > 0 ? forced_splits_ : (8 * num_sms_ + base_blocks - 1) / base_blocks;
    want = std::clamp<int64_t>(want, 1, max_pages);
    chunk = static_cast<int>((max_pages + want - 1) / want) * kPageTokens;
    splits = static_cast<int>((max_pages * kPageTokens + chunk - 1) / chunk);
  }

  // A step graph fixes the plan's size: pad the page tables to a power of two.
  if (mode_ != StepMode::Eager) pages.resize(std::bit_ceil(std::max<size_t>(pages.size(), 16)), 0);
  const size_t pages_bytes = align_up(pages.size() * 4, 16);
  const size_t decode_bytes = decode.size() * sizeof(DecodeItem);
  std::vector<unsigned char> blob(pages_bytes + decode_bytes + prefill.size() * sizeof(PrefillItem), 0);
  if (!pages.empty()) std::memcpy(blob.data(), pages.data(), pages.size() * 4);
  if (!decode.empty()) std::memcpy(blob.data() + pages_bytes, decode.data(), decode_bytes);
  if (!prefill.empty())
    std::memcpy(blob.data() + pages_bytes + decode_bytes, prefill.data(), prefill.size() * sizeof(PrefillItem));

  activate();
  const auto* device_blob = static_cast<const unsigned char*>(stage(attention_plan_, blob.data(), blob.size()));
  note(splits);
  note(chunk);
  note(static_cast<int64_t>(decode.size()));
  note(static_cast<int64_t>(prefill.size()));
  if (dry()) return;
  AttentionArgs args{kv_layout(kv, layer), reinterpret_cast<const int32_t*>(device_blob), q, out,
                     static_cast<int32_t>(nh), static_cast<int32_t>(hd), shape.scale};
  if (!decode.empty()) {
    float* partials = nullptr;
    if (splits > 1)
      partials = static_cast<float*>(
          partials_.get(decode.size() * static_cast<size_t>(nh) * splits * static_cast<size_t>(hd + 2) * 4, stream_));
    launch_decode_attention(args, reinterpret_cast<const DecodeItem*>(device_blob + pages_bytes),
                            static_cast<int>(decode.size()), splits, chunk, partials, stream_);
  }
  if (!prefill.empty())
    launch_prefill_attention(args, reinterpret_cast<const PrefillItem*>(device_blob + pages_bytes + decode_bytes),
                             static_cast<int>(prefill.size()), stream_, prefill_kernel_);
}

}  // namespace cuda
}  // namespace ninfer
