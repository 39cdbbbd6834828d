// KV-cache writes and causal paged attention with grouped-query heads.
//
// Each query row keeps an online-softmax state (running max, running sum, weighted value
// sum) and folds in one 64-token page at a time, so no score matrix is ever materialized.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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

void CpuBackend::kv_write(KvPool& kv, int64_t layer, const float* k, const float* v,
                          std::span<const AttentionSlice> slices) {
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
  const int64_t hd = shape.head_dim, nh = shape.num_heads, nkv = shape.num_kv_heads;
  if (nkv <= 0 || nh % nkv != 0 || hd != kv.head_dim() || nkv != kv.num_kv_heads())
    throw std::invalid_argument("attention: head counts/dims do not match the KV pool");
  for (const auto& s : slices) check_slice(s, kv);
  const int64_t group = nh / nkv;
  const int64_t kv_row = nkv * hd;

  // Tasks: (slice, kv head, block of query rows). All query heads of a kv head and all rows
  // of the block meet each 64-token page together: scores are one small GEMM against the
  // page's keys, the value update another against its values.
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
    const int64_t rows = std::min<int64_t>(s.num_tokens, r0 + kQueryRowsPerTask) - r0;
    const int64_t nq = rows * group;  // query vectors: row-major over (row, head in group)

    thread_local std::vector<float> queries, acc, scores;
    thread_local std::vector<OnlineSoftmax> state;
    queries.resize(static_cast<size_t>(nq * hd));
    acc.assign(static_cast<size_t>(nq * hd), 0.0f);
    scores.resize(static_cast<size_t>(nq * kPageTokens));
    state.assign(static_cast<size_t>(nq), OnlineSoftmax{});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < group; ++g) {
        const float* src = q + ((s.row_begin + r0 + r) * nh + kvh * group + g) * hd;
        float* dst = queries.data() + (r * group + g) * hd;
        for (int64_t d = 0; d < hd; ++d) dst[d] = src[d] * shape.scale;
      }

    const int64_t first_pos = static_cast<int64_t>(s.start_pos) + r0;  // position of the block's first row
    const int64_t last_pos = first_pos + rows - 1;
    for (int64_t page_index = 0; page_index * kPageTokens <= last_pos; ++page_index) {
      const int64_t page_start = page_index * kPageTokens;
      const int32_t page = s.page_table[page_index];
      const float* keys = kv.key_page(layer, page) + kvh * hd;
      const float* values = kv.value_page(layer, page) + kvh * hd;
      const int64_t count = std::min<int64_t>(kPageTokens, last_pos - page_start + 1);
      kernels.tile_f32(queries.data(), hd, nq, keys, kv_row * static_cast<int64_t>(sizeof(float)), count, hd,
                       scores.data(), kPageTokens);
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t visible = std::min(count, first_pos + i / group - page_start + 1);  // causal mask
        float* row_scores = scores.data() + i * kPageTokens;
        OnlineSoftmax& st = state[static_cast<size_t>(i)];
        float page_max = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < visible; ++t) page_max = std::max(page_max, row_scores[t]);
        const float new_max = std::max(st.max, page_max);
        const float rescale = std::exp(st.max - new_max);  // 0 on the first page
        st.sum *= rescale;
        if (rescale != 1.0f) kernels.scale(acc.data() + i * hd, rescale, hd);
        if (visible > 0) st.sum += kernels.exp_shifted_sum(row_scores, visible, new_max);
        for (int64_t t = std::max<int64_t>(visible, 0); t < count; ++t) row_scores[t] = 0.0f;
        st.max = new_max;
      }
      kernels.gemm_accumulate(scores.data(), kPageTokens, nq, values, kv_row, hd, count, acc.data(), hd);
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < group; ++g) {
        const int64_t i = r * group + g;
        float* dst = out + ((s.row_begin + r0 + r) * nh + kvh * group + g) * hd;
        const float inv = 1.0f / state[static_cast<size_t>(i)].sum;
        for (int64_t d = 0; d < hd; ++d) dst[d] = acc[static_cast<size_t>(i * hd + d)] * inv;
      }
  });
}

}  // namespace ninfer::cpu
