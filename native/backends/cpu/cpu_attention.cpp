// KV-cache writes and causal paged attention with grouped-query heads.
//
// Each query row keeps an online-softmax state (running max, running sum, weighted value
// sum) and folds in one 64-token page at a time, so no score matrix is ever materialized.
// Each row's pages are folded in fixed ranges of kPagesPerRange pages whose partial states are
// merged after; when a step has few (sequence, kv head, row block) tasks (decode of long
// sequences), the ranges run as tasks of their own.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
// Pages per range of a row's keys: fixed, so a query row is folded over the same ranges and
// merged in the same order whatever else its step holds (a decode step, a prefill chunk, a
// speculative verification slice) and however many threads run it. Decode steps then give
// the logits of a prefill of the same tokens bit for bit, and speculative decoding the output
// of plain greedy decoding.
constexpr int64_t kPagesPerRange = 8;

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

// RAM the kernel reports as available (MemAvailable), 0 when it cannot be read. C stdio, not
// iostreams: `ifstream >> int64_t` crashed (SIGSEGV inside istream::_M_extract<long>) in the
// GPU machine's Python process, 2026-12-01, where other libraries' C++ runtimes share it.
int64_t host_available_bytes() {
  std::FILE* meminfo = std::fopen("/proc/meminfo", "r");
  if (!meminfo) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof line, meminfo))
    if (std::strncmp(line, "MemAvailable:", 13) == 0) {
      kib = std::strtoll(line + 13, nullptr, 10);
      break;
    }
  std::fclose(meminfo);
  return kib > 0 ? static_cast<int64_t>(kib) * 1024 : 0;
}

}  // namespace

void CpuBackend::bind_kv(KvPool& kv) {
  if (!kv.has_storage()) {
    kv.resolve_size(host_available_bytes(), sizeof(float));
    const auto bytes = static_cast<size_t>(kv.storage_bytes(sizeof(float)));
    // calloc: the OS hands out zero pages lazily, so a large pool costs RAM only as it fills.
    void* memory = std::calloc(std::max<size_t>(bytes, 1), 1);
    if (!memory) throw std::bad_alloc();
    kv.attach_storage({std::shared_ptr<void>(memory, [](void* p) { std::free(p); }), DType::F32, "cpu"});
  } else if (kv.storage().device != "cpu" || kv.storage().dtype != DType::F32) {
    throw std::invalid_argument("the KV pool's storage is " + std::string(dtype_name(kv.storage().dtype)) + " on " +
                                kv.storage().device + "; the CPU backend needs f32 on cpu");
  }
}

void CpuBackend::kv_write(KvPool& kv, int64_t layer, const float* k, const float* v,
                          std::span<const AttentionSlice> slices) {
  bind_kv(kv);
  const int64_t row = kv.num_kv_heads() * kv.head_dim();
  if (kv.quantized()) {
    for (const auto& s : slices) check_slice(s, kv);
    return kv_write_quantized(kv, layer, k, v, slices);
  }
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

namespace {

// One unit of attention work: a block of query rows of one slice and kv head, over a range
// of its pages. Results stay unnormalized (acc, max, sum) until every range is folded in.
struct AttentionWork {
  size_t slice;
  int64_t kv_head, row0, rows, page_begin, page_end;
};

struct AttentionContext {
  KvPool& kv;
  int64_t layer, group, head_dim, num_heads, kv_row;
  float scale;
  const float* q;
  const CpuKernels& kernels;
};

// Folds pages [page_begin, page_end) into acc [nq, head_dim] and state [nq], where the nq
// query vectors are the work's rows times the kv head's query heads.
void attend(const AttentionContext& c, const AttentionSlice& s, const AttentionWork& w, float* acc,
            OnlineSoftmax* state) {
  const int64_t hd = c.head_dim, group = c.group, nq = w.rows * group;
  thread_local std::vector<float> queries, scores, key_rows, value_rows;
  queries.resize(static_cast<size_t>(nq * hd));
  scores.resize(static_cast<size_t>(nq * kPageTokens));
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t g = 0; g < group; ++g) {
      const float* src = c.q + ((s.row_begin + w.row0 + r) * c.num_heads + w.kv_head * group + g) * hd;
      float* dst = queries.data() + (r * group + g) * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] = src[d] * c.scale;
    }
  std::fill(acc, acc + nq * hd, 0.0f);
  std::fill(state, state + nq, OnlineSoftmax{});
  const int64_t first_pos = static_cast<int64_t>(s.start_pos) + w.row0;  // position of the first row
  const int64_t last_pos = first_pos + w.rows - 1;
  for (int64_t page_index = w.page_begin; page_index < w.page_end; ++page_index) {
    const int64_t page_start = page_index * kPageTokens;
    const int32_t page = s.page_table[page_index];
    const int64_t count = std::min<int64_t>(kPageTokens, last_pos - page_start + 1);
    const float* keys;
    const float* values;
    int64_t stride = c.kv_row;  // floats between consecutive keys
    if (c.kv.quantized()) {  // this head's rows of the page, dequantized
      keys = dequantize_page_rows(c.kv, c.layer, page, 0, w.kv_head, count, key_rows);
      values = dequantize_page_rows(c.kv, c.layer, page, 1, w.kv_head, count, value_rows);
      stride = hd;
    } else {
      keys = c.kv.key_page(c.layer, page) + w.kv_head * hd;
      values = c.kv.value_page(c.layer, page) + w.kv_head * hd;
    }
    c.kernels.tile_f32(queries.data(), hd, nq, keys, stride * static_cast<int64_t>(sizeof(float)), count, hd,
                       scores.data(), kPageTokens);
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t visible = std::min(count, first_pos + i / group - page_start + 1);  // causal mask
      float* row_scores = scores.data() + i * kPageTokens;
      OnlineSoftmax& st = state[i];
      if (visible > 0) {
        float page_max = row_scores[0];
        for (int64_t t = 1; t < visible; ++t) page_max = std::max(page_max, row_scores[t]);
        const float new_max = std::max(st.max, page_max);
        const float rescale = std::exp(st.max - new_max);  // 0 while nothing was seen yet
        st.sum *= rescale;
        if (rescale != 1.0f) c.kernels.scale(acc + i * hd, rescale, hd);
        st.sum += c.kernels.exp_shifted_sum(row_scores, visible, new_max);
        st.max = new_max;
      }
      std::fill(row_scores + std::max<int64_t>(visible, 0), row_scores + count, 0.0f);
    }
    c.kernels.gemm_accumulate(scores.data(), kPageTokens, nq, values, stride, hd, count, acc, hd);
  }
}

// Writes acc / sum of each query vector to its place in out [rows, num_heads, head_dim].
void store(const AttentionContext& c, const AttentionSlice& s, const AttentionWork& w, const float* acc,
           const OnlineSoftmax* state, float* out) {
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t g = 0; g < c.group; ++g) {
      const int64_t i = r * c.group + g;
      float* dst = out + ((s.row_begin + w.row0 + r) * c.num_heads + w.kv_head * c.group + g) * c.head_dim;
      const float inv = 1.0f / state[i].sum;
      for (int64_t d = 0; d < c.head_dim; ++d) dst[d] = acc[i * c.head_dim + d] * inv;
    }
}

// Merges the partial states of `parts` page ranges (range p's at acc + p * stride_q * hd and
// state + p * stride_q) into range 0's slots, in range order. With one range it changes nothing
// (every weight is exp(0) = 1).
void merge_ranges(const AttentionContext& c, int64_t nq, int64_t parts, int64_t stride_q, float* acc,
                  OnlineSoftmax* state) {
  const int64_t hd = c.head_dim;
  for (int64_t i = 0; i < nq; ++i) {
    float merged_max = state[i].max;
    for (int64_t part = 1; part < parts; ++part) merged_max = std::max(merged_max, state[part * stride_q + i].max);
    float sum = 0.0f;
    for (int64_t part = 0; part < parts; ++part) {
      const OnlineSoftmax& st = state[part * stride_q + i];
      if (st.sum == 0.0f) continue;  // the range held no visible keys for this query
      const float weight = std::exp(st.max - merged_max);
      sum += st.sum * weight;
      float* part_acc = acc + (part * stride_q + i) * hd;
      if (part == 0)
        c.kernels.scale(part_acc, weight, hd);
      else
        c.kernels.scale_add(acc + i * hd, part_acc, weight, hd);
    }
    state[i].sum = sum;
  }
}

}  // namespace

void CpuBackend::attention(KvPool& kv, int64_t layer, const float* q, std::span<const AttentionSlice> slices,
                           const AttentionShape& shape, float* out) {
  bind_kv(kv);
  const int64_t hd = shape.head_dim, nh = shape.num_heads, nkv = shape.num_kv_heads;
  if (nkv <= 0 || nh % nkv != 0 || hd != kv.head_dim() || nkv != kv.num_kv_heads())
    throw std::invalid_argument("attention: head counts/dims do not match the KV pool");
  for (const auto& s : slices) check_slice(s, kv);
  const AttentionContext ctx{kv, layer, nh / nkv, hd, nh, nkv * hd, shape.scale, q, cpu_kernels()};

  // Blocks of query rows; all query heads of a kv head and all rows of a block meet each page
  // together, so scores are one small GEMM against the page's keys and the value update another.
  std::vector<AttentionWork> blocks;
  for (size_t si = 0; si < slices.size(); ++si) {
    const AttentionSlice& s = slices[si];
    for (int64_t r0 = 0; r0 < s.num_tokens; r0 += kQueryRowsPerTask) {
      const int64_t rows = std::min<int64_t>(kQueryRowsPerTask, s.num_tokens - r0);
      const int64_t pages = (static_cast<int64_t>(s.start_pos) + r0 + rows - 1) / kPageTokens + 1;
      for (int64_t h = 0; h < nkv; ++h) blocks.push_back({si, h, r0, rows, 0, pages});
    }
  }
  const auto block_count = static_cast<int64_t>(blocks.size());
  const int64_t max_q = kQueryRowsPerTask * ctx.group;
  const auto parts_of = [](const AttentionWork& w) {
    return std::max<int64_t>((w.page_end + kPagesPerRange - 1) / kPagesPerRange, 1);
  };
  const auto range_of = [](const AttentionWork& w, int64_t part) {
    AttentionWork piece = w;
    piece.page_begin = std::min(w.page_end, part * kPagesPerRange);
    piece.page_end = std::min(w.page_end, (part + 1) * kPagesPerRange);
    return piece;
  };
  if (block_count >= 2 * static_cast<int64_t>(pool_.size())) {
    // Enough blocks to keep every thread busy: each task folds its block's ranges in turn.
    pool_.parallel_for(block_count, [&](int64_t b) {
      const AttentionWork& w = blocks[static_cast<size_t>(b)];
      const int64_t parts = parts_of(w);
      thread_local std::vector<float> acc;
      thread_local std::vector<OnlineSoftmax> state;
      acc.resize(static_cast<size_t>(parts * max_q * hd));
      state.resize(static_cast<size_t>(parts * max_q));
      for (int64_t part = 0; part < parts; ++part)
        attend(ctx, slices[w.slice], range_of(w, part), acc.data() + part * max_q * hd, state.data() + part * max_q);
      merge_ranges(ctx, w.rows * ctx.group, parts, max_q, acc.data(), state.data());
      store(ctx, slices[w.slice], w, acc.data(), state.data(), out);
    });
    return;
  }

  // Few blocks (decode of long sequences): every (block, range) pair is a task of its own;
  // partial states land in per-range slots and are merged per block after.
  std::vector<int64_t> first_part(static_cast<size_t>(block_count) + 1, 0);
  for (int64_t b = 0; b < block_count; ++b)
    first_part[static_cast<size_t>(b) + 1] =
        first_part[static_cast<size_t>(b)] + parts_of(blocks[static_cast<size_t>(b)]);
  const int64_t total_parts = first_part.back();
  partial_acc_.resize(static_cast<size_t>(total_parts * max_q * hd));
  partial_state_.resize(static_cast<size_t>(total_parts * max_q));
  std::vector<int64_t> block_of(static_cast<size_t>(total_parts));
  for (int64_t b = 0; b < block_count; ++b)
    for (int64_t t = first_part[static_cast<size_t>(b)]; t < first_part[static_cast<size_t>(b) + 1]; ++t)
      block_of[static_cast<size_t>(t)] = b;
  pool_.parallel_for(total_parts, [&](int64_t task) {
    const int64_t b = block_of[static_cast<size_t>(task)];
    const AttentionWork piece = range_of(blocks[static_cast<size_t>(b)], task - first_part[static_cast<size_t>(b)]);
    attend(ctx, slices[piece.slice], piece, partial_acc_.data() + task * max_q * hd,
           partial_state_.data() + task * max_q);  // an empty range leaves max = -inf, sum = 0
  });
  pool_.parallel_for(block_count, [&](int64_t b) {
    const AttentionWork& w = blocks[static_cast<size_t>(b)];
    const int64_t first = first_part[static_cast<size_t>(b)];
    float* acc = partial_acc_.data() + first * max_q * hd;  // merged into the first range's slot
    OnlineSoftmax* state = partial_state_.data() + first * max_q;
    merge_ranges(ctx, w.rows * ctx.group, first_part[static_cast<size_t>(b) + 1] - first, max_q, acc, state);
    store(ctx, slices[w.slice], w, acc, state, out);
  });
}

}  // namespace ninfer::cpu
