#include "backends/backend.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "cache/kv_pool.h"

namespace ninfer {

void kv_page_io_host(KvPool& kv, int32_t page, void* host, bool to_host) {
  if (!kv.has_storage() || kv.storage().device != "cpu")
    throw std::runtime_error("kv_page_io: the KV pool's storage is not in host memory");
  if (page < 0 || page >= kv.num_pages()) throw std::out_of_range("kv_page_io: page outside the pool");
  const int64_t element = row_bytes(kv.storage().dtype, 1);
  const auto piece = static_cast<size_t>(kv.region_bytes(element));
  auto* base = static_cast<std::byte*>(kv.storage().memory.get());
  auto* at = static_cast<std::byte*>(host);
  for (int64_t layer = 0; layer < kv.num_layers(); ++layer)
    for (int which = 0; which < 2; ++which, at += piece) {
      std::byte* stored = base + kv.region_offset(layer, page, which, element);
      if (to_host) std::memcpy(at, stored, piece);
      else std::memcpy(stored, at, piece);
    }
}

void MoeExperts::check(int64_t hidden) const {
  if (num_experts <= 0 || ff <= 0 || top_k <= 0 || top_k > num_experts)
    throw std::invalid_argument("moe_experts: need num_experts > 0, ff > 0 and top_k in [1, num_experts]");
  if (first_expert < 0 || local_experts < 0 || first_expert + held_experts() > num_experts)
    throw std::invalid_argument("moe_experts: the held experts are outside [0, num_experts)");
  if (gate_up.rows != held_experts() * 2 * ff || gate_up.cols != hidden || down.rows != held_experts() * hidden ||
      down.cols != ff)
    throw std::invalid_argument("moe_experts: stacked expert weights do not match [E·2ff, H] and [E·H, ff]");
}

Weight Backend::random_weight(int64_t, int64_t, uint64_t, float) {
  throw std::runtime_error("the " + name() + " backend cannot make random weights");
}

Weight Backend::random_quantized_weight(DType dtype, int64_t rows, int64_t cols, int64_t, uint64_t seed, float scale) {
  if (dtype == DType::BF16) return random_weight(rows, cols, seed, scale);
  throw std::runtime_error("the " + name() + " backend cannot make random " + std::string(dtype_name(dtype)) +
                           " weights");
}

namespace {

[[noreturn]] void not_implemented(const Backend& backend, const char* op) {
  throw std::runtime_error(std::string(op) + " is not implemented on " + backend.name() + " yet");
}

}  // namespace

void Backend::fill_zero(float*, int64_t) { not_implemented(*this, "fill_zero"); }

void Backend::kv_page_io(KvPool& kv, int32_t page, void* host, bool to_host) {
  kv_page_io_host(kv, page, host, to_host);
}
void Backend::copy(float*, const float*, int64_t) { not_implemented(*this, "copy"); }
void Backend::gdn_mixer(const GdnShape&, const GdnLayerWeights&, std::span<const GdnSlice>, float*,
                        const float*, const float*, const float*, float*, GdnForm) {
  not_implemented(*this, "gdn_mixer");
}

void Backend::gdn_mixer_projected(const GdnShape& shape, const GdnLayerWeights& weights,
                                  std::span<const GdnSlice> slices, float* mixed, const float* z, const float* b,
                                  const float* a, float* out, const Weight& out_proj, float* y) {
  gdn_mixer(shape, weights, slices, mixed, z, b, a, out);
  int64_t rows = 0;
  for (const auto& s : slices) rows += s.num_tokens;
  if (rows > 0) matmul(out, rows, out_proj, nullptr, y);
}
void Backend::split_query_gate(const float*, int64_t, int64_t, int64_t, float*, float*) {
  not_implemented(*this, "split_query_gate");
}
void Backend::sigmoid_mul(float*, const float*, int64_t) { not_implemented(*this, "sigmoid_mul"); }
void Backend::add_sigmoid_gated(float*, const float*, const float*, int64_t, int64_t) {
  not_implemented(*this, "add_sigmoid_gated");
}
void Backend::moe_experts(const float*, int64_t, int64_t, const float*, const MoeExperts&, float*) {
  not_implemented(*this, "moe_experts");
}
void Backend::concat_columns(const float*, int64_t, const float*, int64_t, int64_t, float*) {
  not_implemented(*this, "concat_columns");
}
void Backend::sample_rows(float*, int64_t, const SamplingBatch&, int32_t*) { not_implemented(*this, "sample_rows"); }

#ifndef NINFER_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int) {
  throw std::runtime_error("device 'cuda' is not available: this build has no CUDA backend");
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  if (device == "cuda") return make_cuda_backend(0);
  if (device.rfind("cuda:", 0) == 0) {
    const std::string index = device.substr(5);
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos && index.size() < 6)
      return make_cuda_backend(std::stoi(index));
  }
  throw std::runtime_error("unknown device '" + device + "' (expected cpu, cuda or cuda:N)");
}

}  // namespace ninfer
