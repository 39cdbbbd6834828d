// KV-cache writes and causal paged attention with grouped-query heads.
//
// Each query row keeps an online-softmax state (running max, running sum, weighted value
// sum) and folds in one 64-token page at a time, so no score matrix is ever materialized.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "cache/kv_pool.h"

namespace ninfer::cpu {

namespace {

constexpr int64_t kQueryRowsPerTask = 16;

void check_slice(const AttentionSlice& s, const KvPool& kv) {
  const int64_t end = static_cast<int64_t>(s.start_pos) + s.num_tokens;
  if (s.start_pos < 0 || s.num_tokens < 0 || (end + kPageTokens - 1) / kPageTokens > s.num_pages)
    throw std::invalid_argument("attention slice at position " + std::to_string(s.start_pos) + " with " +
                                std::to_string(s.num_tokens) + " tokens needs more than its " +
                                std::to_string(s.num_pages) + " pages");
  for (int32_t p = 0; p < s.num_pages; ++p)
    if (s.page_table[p] < 0 || s.page_table[p] >= kv.num_pages())
      throw std::out_of_range("page id " + std::to_string(s.page_table[p]) + " is outside the KV pool");
}

// Softmax state of one query row and head: out = acc / sum, scores relative to max.
struct OnlineSoftmax {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
};

}  // namespace

void CpuBackend::bind_kv(KvPool& kv) {
  if (!kv.has_storage()) {
    const auto elems = static_cast<size_t>(kv.storage_elems());
    kv.attach_storage({std::shared_ptr<void>(new float[elems](), std::default_delete<float[]>()), DType::F32, "cpu"});
  } else if (kv.storage().device != "cpu" || kv.storage().dtype != DType::F32) {
    throw std::invalid_argument("the KV pool's storage is " + std::string(dtype_name(kv.storage().dtype)) + " on " +
                                kv.storage().device + "; the CPU backend needs f32 on cpu");
  }
}

void CpuBackend::kv_write(KvPool& kv, int64_t layer, const float* k, const float* v,
                          std::span<const AttentionSlice> slices) {
  bind_kv(kv);
  const int64_t row = kv.num_kv_heads() * kv.head_dim();
  for (const auto& s : slices) {
    check_slice(s, kv);
    for (int32_t i = 0; i < s.num_tokens; ++i) {
      const int64_t pos = static_cast<int64_t>(s.start_pos) + i;
      const int32_t page = s.page_table[pos / kPageTokens];
      const int64_t offset = (pos % kPageTokens) * row;
      const int64_t src = (static_cast<int64_t>(s.row_begin) + i) * row;
      std::memcpy(kv.key_page(layer, page) + offset, k + src, static_cast<size_t>(row) * sizeof(float));
      std::memcpy(kv.value_page(layer, page) + offset, v + src, static_cast<size_t>(row) * sizeof(float));
    }
  }
}

void CpuBackend::attention(KvPool& kv, int64_t layer, const float* q, std::span<const AttentionSlice> slices,
                           const AttentionShape& shape, float* out) {
  bind_kv(kv);
  const int64_t hd = shape.head_dim, nh = shape.num_heads, nkv = shape.num_kv_heads;
  if (nkv <= 0 || nh % nkv != 0 || hd != kv.head_dim() || nkv != kv.num_kv_heads())
    throw std::invalid_argument("attention: head counts/dims do not match the KV pool");
  for (const auto& s : slices) check_slice(s, kv);
  const int64_t group = nh / nkv;
  const int64_t kv_row = nkv * hd;

  // Tasks: (slice, kv head, block of query rows).
  std::vector<int64_t> first_task(slices.size() + 1, 0);
  for (size_t i = 0; i < slices.size(); ++i)
    first_task[i + 1] = first_task[i] + nkv * ((slices[i].num_tokens + kQueryRowsPerTask - 1) / kQueryRowsPerTask);
  const CpuKernels& kernels = cpu_kernels();

  pool_.parallel_for(first_task.back(), [&](int64_t task) {
    const size_t si = static_cast<size_t>(std::upper_bound(first_task.begin(), first_task.end(), task) -
                                          first_task.begin() - 1);
    const AttentionSlice& s = slices[si];
    const int64_t local = task - first_task[si];
    const int64_t kvh = local % nkv;
    const int64_t r0 = (local / nkv) * kQueryRowsPerTask;
    const int64_t r1 = std::min<int64_t>(s.num_tokens, r0 + kQueryRowsPerTask);
    float scores[kPageTokens];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t last = static_cast<int64_t>(s.start_pos) + r;  // attends to [0, last]
      const int64_t row = s.row_begin + r;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        const float* qv = q + (row * nh + h) * hd;
        float* o = out + (row * nh + h) * hd;
        std::fill(o, o + hd, 0.0f);
        OnlineSoftmax state;
        for (int64_t page_index = 0; page_index * kPageTokens <= last; ++page_index) {
          const int32_t page = s.page_table[page_index];
          const float* keys = kv.key_page(layer, page) + kvh * hd;
          const float* values = kv.value_page(layer, page) + kvh * hd;
          const int64_t count = std::min<int64_t>(kPageTokens, last - page_index * kPageTokens + 1);
          float page_max = -std::numeric_limits<float>::infinity();
          for (int64_t t = 0; t < count; ++t) {
            scores[t] = kernels.dot(qv, keys + t * kv_row, hd) * shape.scale;
            page_max = std::max(page_max, scores[t]);
          }
          const float new_max = std::max(state.max, page_max);
          const float rescale = std::exp(state.max - new_max);  // 0 on the first page
          state.sum *= rescale;
          kernels.scale(o, rescale, hd);
          for (int64_t t = 0; t < count; ++t) {
            const float p = std::exp(scores[t] - new_max);
            state.sum += p;
            kernels.scale_add(o, values + t * kv_row, p, hd);
          }
          state.max = new_max;
        }
        kernels.scale(o, 1.0f / state.sum, hd);
      }
    }
  });
}

}  // namespace ninfer::cpu
