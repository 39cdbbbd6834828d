// KV-cache writes and split-KV paged attention for single query rows (decode).
//
// A block serves one query row, one KV head, up to kDecodeMaxGroup of the query heads that
// share it (GQA: each key is loaded once for all of them) and one split of the key axis.
// Each thread owns 8 consecutive elements (one 16-byte load) of a key row; kThreadsPerKey =
// HD / 8 threads cover a key, so the block walks (128 / kThreadsPerKey) x U keys at a time,
// each thread group keeping its own online-softmax state. The groups' states merge through shared
// memory at the end; with several splits the merged state goes to a partials buffer that
// combine_splits folds into the output. A quantized pool (F != kKvBf16) is read through
// KvRead<F>: 8 codes and their scales per thread and key, dequantized after the load lands.
#pragma once

#include <cfloat>

#include "backends/cuda/attention_plan.h"
#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/kernels_kv_quant.cuh"

namespace ninfer::cuda::kernels {

inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeMaxGroup = 8;
inline constexpr int kKvPageTokens = 64;

__device__ __forceinline__ const uint16_t* kv_row(const KvLayout& kv, int32_t page, int which, int slot,
                                                  int head_dim) {
  const int64_t page_offset = ((static_cast<int64_t>(kv.layer) * kv.num_pages + page) * 2 + which) * kv.page_elems;
  return static_cast<const uint16_t*>(kv.base) + page_offset + static_cast<int64_t>(slot) * kv.num_kv_heads * head_dim;
}

// One block per row; threads cover the row's num_kv_heads * head_dim values.
__global__ void kv_write(KvLayout kv, int head_dim, const float* __restrict__ k, const float* __restrict__ v,
                         const int32_t* __restrict__ slots) {
  const int64_t row = blockIdx.x;
  const int32_t slot = slots[row];
  if (slot < 0) return;  // a row no slice writes
  const int32_t page = slot / kKvPageTokens;
  const int width = kv.num_kv_heads * head_dim;
  uint16_t* kd = const_cast<uint16_t*>(kv_row(kv, page, 0, slot % kKvPageTokens, head_dim));
  uint16_t* vd = const_cast<uint16_t*>(kv_row(kv, page, 1, slot % kKvPageTokens, head_dim));
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    kd[i] = float_to_bf16_bits(k[row * width + i]);
    vd[i] = float_to_bf16_bits(v[row * width + i]);
  }
}

struct DecodeParams {
  KvLayout kv;
  const int32_t* pages;
  const DecodeItem* items;
  const float* q;
  float* out;       // used when splits == 1
  float* partials;  // [items][num_heads][splits] x (m, l, acc[HD]) when splits > 1
  int num_heads;
  int group;        // query heads per KV head
  int splits;
  int chunk;        // keys per split, a multiple of 64
  float scale;
};

// G: query heads served per block (a power of two >= the GQA group, at most kDecodeMaxGroup),
// so every per-head loop is fully unrolled without a runtime bound and the G dot products of
// a key reduce as independent shuffle chains. U: keys each thread group takes per iteration
// (their loads are issued together and the next U keys' loads are in flight during the
// arithmetic). Scores are kept in the log2 domain (q is prescaled by scale * log2(e)).
template <int HD, int G, int U, int F = kKvBf16>
__global__ void __launch_bounds__(kDecodeThreads) decode_attention(const DecodeParams p) {
  using Read = KvRead<F>;
  using Raw = typename Read::Raw;
  constexpr int kThreadsPerKey = HD / 8;
  constexpr int kKeyGroups = kDecodeThreads / kThreadsPerKey;  // thread groups in the block
  constexpr int kStride = kKeyGroups * U;                      // keys the block takes per iteration
  const DecodeItem item = p.items[blockIdx.x];
  const int group_chunks = (p.group + G - 1) / G;
  const int kv_head = blockIdx.y / group_chunks;
  const int group_chunk = blockIdx.y % group_chunks;
  const int head0 = kv_head * p.group + group_chunk * G;
  const int num_g = min(G, p.group - group_chunk * G);
  const int split = blockIdx.z;
  const int key_begin = split * p.chunk;
  const int key_end = min(item.kv_len, key_begin + p.chunk);

  const int key_lane = threadIdx.x / kThreadsPerKey;  // which thread group
  const int sub = threadIdx.x % kThreadsPerKey;       // which 8 elements of the row
  const int lane = threadIdx.x & 31;
  const unsigned group_mask =
      kThreadsPerKey == 32 ? 0xffffffffu : (((1u << kThreadsPerKey) - 1u) << (lane & ~(kThreadsPerKey - 1)));

  constexpr float kLog2e = 1.4426950408889634f;
  float qv[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      qv[g][j] = g < num_g ? p.q[(static_cast<int64_t>(item.row) * p.num_heads + head0 + g) * HD + sub * 8 + j] *
                                 (p.scale * kLog2e)
                           : 0.0f;

  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
  }

  auto load = [&](int key, Raw& kp, Raw& vp) {
    if (key >= key_end) {
      kp = Read::zero();
      vp = kp;
      return;
    }
    const int32_t page = p.pages[item.pages_offset + key / kKvPageTokens];
    const int slot = key % kKvPageTokens;
    kp = Read::template load<HD>(p.kv, page, 0, slot, kv_head, sub);
    vp = Read::template load<HD>(p.kv, page, 1, slot, kv_head, sub);
  };
  int key0 = key_begin + key_lane * U;
  Raw k_cur[U], v_cur[U];
#pragma unroll
  for (int u = 0; u < U; ++u) load(key0 + u, k_cur[u], v_cur[u]);
  while (key0 < key_end) {
    const int next0 = key0 + kStride;
    Raw k_next[U], v_next[U];
#pragma unroll
    for (int u = 0; u < U; ++u) load(next0 + u, k_next[u], v_next[u]);
    float s[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      Read::to_float(k_cur[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot = fmaf(qv[g][j], kf[j], dot);
        s[u][g] = dot;
      }
    }
#pragma unroll
    for (int offset = kThreadsPerKey / 2; offset > 0; offset >>= 1)
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g) s[u][g] += __shfl_xor_sync(group_mask, s[u][g], offset);
    float vf[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u) Read::to_float(v_cur[u], vf[u]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (key0 + u < key_end) m_new = fmaxf(m_new, s[u][g]);
      const float correction = exp2f(m[g] - m_new);
      float w[U];
      float w_sum = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        w[u] = key0 + u < key_end ? exp2f(s[u][g] - m_new) : 0.0f;
        w_sum += w[u];
      }
      l[g] = fmaf(l[g], correction, w_sum);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float a = acc[g][j] * correction;
#pragma unroll
        for (int u = 0; u < U; ++u) a = fmaf(w[u], vf[u][j], a);
        acc[g][j] = a;
      }
      m[g] = m_new;
    }
    key0 = next0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      k_cur[u] = k_next[u];
      v_cur[u] = v_next[u];
    }
  }

  // Merge the thread groups' states.
  __shared__ float s_m[kKeyGroups][G];
  __shared__ float s_l[kKeyGroups][G];
  __shared__ float s_acc[kKeyGroups][G][HD];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (sub == 0) {
      s_m[key_lane][g] = m[g];
      s_l[key_lane][g] = l[g];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) s_acc[key_lane][g][sub * 8 + j] = acc[g][j];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < num_g * HD; idx += kDecodeThreads) {
    const int g = idx / HD, d = idx % HD;
    float m_all = -FLT_MAX;
#pragma unroll
    for (int i = 0; i < kKeyGroups; ++i) m_all = fmaxf(m_all, s_m[i][g]);
    float l_all = 0.0f, a_all = 0.0f;
#pragma unroll
    for (int i = 0; i < kKeyGroups; ++i) {
      const float w = s_l[i][g] > 0.0f ? exp2f(s_m[i][g] - m_all) : 0.0f;
      l_all += s_l[i][g] * w;
      a_all += s_acc[i][g][d] * w;
    }
    const int64_t out_index = static_cast<int64_t>(item.row) * p.num_heads + head0 + g;
    if (p.splits == 1) {
      p.out[out_index * HD + d] = a_all / l_all;
    } else {
      const int64_t part = (static_cast<int64_t>(blockIdx.x) * p.num_heads + head0 + g) * p.splits + split;
      float* dst = p.partials + part * (HD + 2);
      if (d == 0) {
        dst[0] = m_all;  // log2 domain
        dst[1] = l_all;
      }
      dst[2 + d] = a_all;
    }
  }
}

// One block per (item, head); HD threads fold the splits' states into the output row. The
// splits' (m, l) pairs are spread over the threads (independent loads, two block reductions)
// and their weights kept in shared memory (`splits` floats, dynamic), so the final pass over
// the accumulators issues independent loads instead of a chain of dependent ones.
template <int HD>
__global__ void combine_splits(const DecodeItem* __restrict__ items, const float* __restrict__ partials,
                               int num_heads, int splits, float* __restrict__ out) {
  extern __shared__ float weight[];
  __shared__ float reduce[HD / 32];
  const int head = blockIdx.y, d = threadIdx.x, lane = d & 31, warp = d >> 5;
  const float* base = partials + (static_cast<int64_t>(blockIdx.x) * num_heads + head) * splits * (HD + 2);
  float m = -FLT_MAX;
  for (int s = d; s < splits; s += HD)
    if (base[s * (HD + 2) + 1] > 0.0f) m = fmaxf(m, base[s * (HD + 2)]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (lane == 0) reduce[warp] = m;
  __syncthreads();
  float m_all = -FLT_MAX;
#pragma unroll
  for (int w = 0; w < HD / 32; ++w) m_all = fmaxf(m_all, reduce[w]);
  float l = 0.0f;
  for (int s = d; s < splits; s += HD) {
    const float* part = base + s * (HD + 2);
    const float w = part[1] > 0.0f ? exp2f(part[0] - m_all) : 0.0f;  // empty split: past the row's keys; m in log2 units
    weight[s] = w;
    l += part[1] * w;
  }
  l = warp_sum(l);
  __syncthreads();  // every thread has read reduce[] (max) and written its weights
  if (lane == 0) reduce[warp] = l;
  __syncthreads();
  float l_all = 0.0f;
#pragma unroll
  for (int w = 0; w < HD / 32; ++w) l_all += reduce[w];
  float a_all = 0.0f;
#pragma unroll 8
  for (int s = 0; s < splits; ++s)
    if (weight[s] != 0.0f) a_all += weight[s] * base[s * (HD + 2) + 2 + d];
  out[(static_cast<int64_t>(items[blockIdx.x].row) * num_heads + head) * HD + d] = a_all / l_all;
}

}  // namespace ninfer::cuda::kernels
