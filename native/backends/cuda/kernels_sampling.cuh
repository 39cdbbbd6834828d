// Token selection on the device: the engine's Sampler (engine/sampler.h) with the row's draw
// given, so that only the chosen ids leave the device. One thread-block cluster per logit row;
// each block of the cluster owns a contiguous slice of the row, and the blocks combine their
// partial results through distributed shared memory.
//
// The Sampler sorts; a block cannot sort 248k candidates cheaply, but every decision the
// Sampler makes is "the first element, in some total order, at which a running sum reaches a
// target": top_k (count k, order logit desc / id asc), top_p (mass top_p · total, order weight
// desc / id asc), the draw (mass u · total, strictly exceeded; weight order after top_p, else
// id order). sample_find_cut answers each with a most-significant-digit-first radix search on
// a 64-bit key that encodes the order (value bits, then the inverted id): one pass over the
// row per 8-bit digit builds a histogram of counts and masses of the elements that share the
// prefix found so far, and one warp picks the digit where the running sum crosses the target.
// The search stops as soon as that digit holds one element (or, for >=, when the sum lands on
// the target exactly), so a few passes usually settle it. Masses are summed as integers in
// units of 2^-32 (a weight is at most 1, a row's mass below 2^50): native shared atomics, sums
// exact in any order and in double, so every block of a cluster takes the same decision and a
// row's result does not depend on scheduling. They differ from the Sampler's double sums by at
// most 2^-33 per element.
//
// Arithmetic that decides membership is the Sampler's, rounded the same way: penalties and
// the temperature scaling use explicitly rounded float ops (no contraction into FMAs), and the
// weight exp((l - max) / T) is evaluated in double and rounded to float, which agrees with the
// host's expf except where that is off by its last bit.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/launchers_sampling.h"
#include "common/row_sampling.h"

namespace ninfer::cuda::kernels {

namespace cg = cooperative_groups;

inline constexpr int kSampleThreads = 512;
inline constexpr int kSampleWarps = kSampleThreads / 32;
inline constexpr int kSampleDigitBits = 8;
inline constexpr int kSampleBuckets = 1 << kSampleDigitBits;
inline constexpr int kSampleHistCopies = 8;  // warps spread their atomics over this many histograms
inline constexpr double kSampleMassUnit = 4294967296.0;  // masses are counted in units of 2^-32

struct SampleShared {
  unsigned int count[kSampleHistCopies][kSampleBuckets];  // copy 0 ends up holding the block's sum
  unsigned long long mass[kSampleHistCopies][kSampleBuckets];
  int id[kSampleHistCopies][kSampleBuckets];
  unsigned int merged_count[kSampleBuckets];  // the cluster's histogram
  unsigned long long merged_mass[kSampleBuckets];
  int merged_id[kSampleBuckets];
  float warp_best[kSampleWarps];
  int warp_best_id[kSampleWarps];
  int warp_nan[kSampleWarps];
  float block_best;  // this block's slice: best logit, its id, any NaN (read by the cluster)
  int block_best_id;
  int block_nan;
  float row_best;  // the whole row's
  int row_best_id;
  int row_nan;
  // sample_find_cut's decision after each pass, written by warp 0
  unsigned long long prefix;
  int shift;
  int done;
  int found_id;
  double above;
};

// The cut of a search: element e ranks at or above it iff (key(e) >> shift) >= prefix
// (shift 64: every element). id is the cut element itself once known (else -1).
struct SampleCut {
  unsigned long long prefix = 0;
  int shift = 64;
  int id = -1;
  __device__ bool admits(unsigned long long key) const { return shift >= 64 || (key >> shift) >= prefix; }
};

// Order-preserving map of a float to uint32 (-0 and +0 equal, as they compare).
__device__ __forceinline__ uint32_t sample_orderable(float x) {
  const uint32_t bits = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Larger key = ranked first: value descending, then id ascending.
__device__ __forceinline__ unsigned long long sample_key(uint32_t value_bits, int64_t id) {
  return (static_cast<unsigned long long>(value_bits) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// True when even value is better than the incumbent: larger, or equal with a lower id.
__device__ __forceinline__ bool sample_better(float value, int id, float best, int best_id) {
  return value > best || (value == best && id >= 0 && (best_id < 0 || id < best_id));
}

// The slice [lo, hi) of a row that one block of the cluster owns (multiples of 4 apart, so
// that rows of a vocabulary divisible by 4 load as float4).
struct SampleSlice {
  int64_t lo, hi;
  __device__ SampleSlice(int64_t n, unsigned int rank, unsigned int blocks) {
    const int64_t chunk = ((n + blocks - 1) / blocks + 3) / 4 * 4;
    lo = min(n, static_cast<int64_t>(rank) * chunk);
    hi = min(n, lo + chunk);
  }
};

// f(i, value) for every element of the block's slice, several vector loads in flight per thread.
template <typename F>
__device__ __forceinline__ void sample_for_each(const float* row, const SampleSlice& s, F&& f) {
  const bool vectorized = ((s.lo | s.hi) & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  if (!vectorized) {
    for (int64_t i = s.lo + threadIdx.x; i < s.hi; i += blockDim.x) f(i, row[i]);
    return;
  }
  constexpr int kUnroll = 4;
  const float4* v = reinterpret_cast<const float4*>(row + s.lo);
  const int64_t nv = (s.hi - s.lo) >> 2, stride = blockDim.x;
  int64_t j = threadIdx.x;
  for (; j + (kUnroll - 1) * stride < nv; j += kUnroll * stride) {
    float4 a[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) a[u] = v[j + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = s.lo + 4 * (j + u * stride);
      f(i, a[u].x);
      f(i + 1, a[u].y);
      f(i + 2, a[u].z);
      f(i + 3, a[u].w);
    }
  }
  for (; j < nv; j += stride) {
    const float4 a = v[j];
    const int64_t i = s.lo + 4 * j;
    f(i, a.x);
    f(i + 1, a.y);
    f(i + 2, a.z);
    f(i + 3, a.w);
  }
}

// row[i] = g(i, row[i]) over the block's slice (each element by the thread sample_for_each
// gives it).
template <typename G>
__device__ __forceinline__ void sample_transform(float* row, const SampleSlice& s, G&& g) {
  const bool vectorized = ((s.lo | s.hi) & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  if (!vectorized) {
    for (int64_t i = s.lo + threadIdx.x; i < s.hi; i += blockDim.x) row[i] = g(i, row[i]);
    return;
  }
  float4* v = reinterpret_cast<float4*>(row + s.lo);
  const int64_t nv = (s.hi - s.lo) >> 2;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
    float4 a = v[j];
    const int64_t i = s.lo + 4 * j;
    a.x = g(i, a.x);
    a.y = g(i + 1, a.y);
    a.z = g(i + 2, a.z);
    a.w = g(i + 3, a.w);
    v[j] = a;
  }
}

// Finds the first element, in descending key order among the elements `element` admits, whose
// running mass reaches `target` (>=, or > when strict); target = fraction · (total admitted
// mass) when relative. Falls back to the last element when rounding leaves the target out of
// reach. element(i, value, key, mass) -> bool, mass in [0, 1]. Every thread of the cluster
// calls it.
template <typename Element>
__device__ SampleCut sample_find_cut(SampleShared& sh, const float* row, const SampleSlice& slice, int key_bits,
                                     Element element, double target_value, bool relative, bool strict) {
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  const int copy = (tid >> 5) % kSampleHistCopies;
  unsigned long long prefix = 0;
  int shift = key_bits;
  // warp 0's copies, in mass units (integers below 2^53: exact in double)
  double above = 0.0, target = relative ? target_value : target_value * kSampleMassUnit;
  bool first_pass = true;
  for (;;) {
    const int bits = min(kSampleDigitBits, shift);
    const int next_shift = shift - bits;
    const unsigned int digit_mask = (1u << bits) - 1u;
    for (int j = tid; j < kSampleHistCopies * kSampleBuckets; j += blockDim.x) {
      (&sh.count[0][0])[j] = 0;
      (&sh.mass[0][0])[j] = 0;
      (&sh.id[0][0])[j] = -1;
    }
    __syncthreads();
    // Runs of one digit are summed in registers first: a peaked row puts most elements in one
    // bucket, and shared atomics on one address serialise.
    int run_digit = -1, run_id = -1;
    unsigned int run_count = 0;
    unsigned long long run_mass = 0;
    auto flush = [&] {
      if (run_count == 0) return;
      atomicAdd(&sh.count[copy][run_digit], run_count);
      atomicAdd(&sh.mass[copy][run_digit], run_mass);
      sh.id[copy][run_digit] = run_id;  // read only where the bucket holds one element
    };
    sample_for_each(row, slice, [&](int64_t i, float value) {
      unsigned long long key;
      double m;
      if (!element(i, value, key, m)) return;
      if (shift < 64 && (key >> shift) != prefix) return;
      const int d = static_cast<int>((key >> next_shift) & digit_mask);
      if (d != run_digit) {
        flush();
        run_digit = d;
        run_count = 0;
        run_mass = 0;
      }
      ++run_count;
      run_mass += __double2ull_rn(m * kSampleMassUnit);
      run_id = static_cast<int>(i);
    });
    flush();
    __syncthreads();
    for (int d = tid; d < kSampleBuckets; d += blockDim.x) {
#pragma unroll
      for (int k = 1; k < kSampleHistCopies; ++k) {
        sh.count[0][d] += sh.count[k][d];
        sh.mass[0][d] += sh.mass[k][d];
        sh.id[0][d] = max(sh.id[0][d], sh.id[k][d]);
      }
    }
    cluster.sync();  // every block's histogram is complete
    for (int d = tid; d < kSampleBuckets; d += blockDim.x) {
      unsigned int c = 0;
      unsigned long long m = 0;
      int id = -1;
      for (unsigned int r = 0; r < cluster.num_blocks(); ++r) {  // rank order: the same sums everywhere
        c += cluster.map_shared_rank(&sh.count[0][0], r)[d];
        m += cluster.map_shared_rank(&sh.mass[0][0], r)[d];
        id = max(id, cluster.map_shared_rank(&sh.id[0][0], r)[d]);
      }
      sh.merged_count[d] = c;
      sh.merged_mass[d] = m;
      sh.merged_id[d] = id;
    }
    cluster.sync();  // no block clears its histogram while another still reads it
    if (tid < 32) {
      // Lane l holds buckets 255 - 8l ... 248 - 8l: lanes in descending digit order.
      constexpr int kPerLane = kSampleBuckets / 32;
      double lane_mass = 0.0;
#pragma unroll
      for (int b = 0; b < kPerLane; ++b)
        lane_mass += static_cast<double>(sh.merged_mass[kSampleBuckets - 1 - (lane * kPerLane + b)]);
      double inclusive = lane_mass;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const double other = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      const double all = __shfl_sync(0xffffffffu, inclusive, 31);
      if (first_pass && relative) target = target_value * all;
      double running = above + (inclusive - lane_mass);
      int hit = -1, last = -1;
      double hit_above = 0.0, last_above = 0.0;
#pragma unroll
      for (int b = 0; b < kPerLane; ++b) {
        const int d = kSampleBuckets - 1 - (lane * kPerLane + b);
        if (sh.merged_count[d] == 0) continue;
        const double through = running + static_cast<double>(sh.merged_mass[d]);
        if (hit < 0 && (strict ? through > target : through >= target)) {
          hit = d;
          hit_above = running;
        }
        last = d;
        last_above = running;
        running = through;
      }
      const unsigned int hits = __ballot_sync(0xffffffffu, hit >= 0);
      const unsigned int nonempty = __ballot_sync(0xffffffffu, last >= 0);
      // The first lane that crosses; else (rounding) the last non-empty bucket.
      const int owner = hits ? __ffs(hits) - 1 : (nonempty ? 31 - __clz(nonempty) : 0);
      if (lane == owner) {
        const int d = hits ? hit : last;
        if (d < 0) {  // nothing admitted at all
          sh.done = 1;
          sh.found_id = -1;
          sh.shift = 64;
          sh.prefix = 0;
        } else {
          const double bucket_above = hits ? hit_above : last_above;
          const unsigned int c = sh.merged_count[d];
          const bool lands_exactly =
              !strict && hits && bucket_above + static_cast<double>(sh.merged_mass[d]) == target;
          sh.prefix = (shift >= 64 ? 0ull : prefix << bits) | static_cast<unsigned long long>(d);
          sh.shift = next_shift;
          sh.above = bucket_above;
          sh.found_id = c == 1 ? sh.merged_id[d] : -1;
          sh.done = c == 1 || next_shift == 0 || lands_exactly;
        }
      }
      __syncwarp();
    }
    __syncthreads();
    prefix = sh.prefix;
    shift = sh.shift;
    above = sh.above;
    first_pass = false;
    const bool done = sh.done;
    SampleCut cut;
    cut.prefix = prefix;
    cut.shift = shift;
    cut.id = sh.found_id;
    __syncthreads();  // every thread has read sh before warp 0 may write it again
    if (done) return cut;
  }
}

// Grid: rows × (cluster size) blocks, one cluster per row.
__global__ void __launch_bounds__(kSampleThreads) sample_rows_kernel(SampleRowsArgs args) {
  __shared__ SampleShared sh;
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t n = args.vocab;
  const unsigned int blocks = cluster.num_blocks();
  const int64_t row_index = blockIdx.x / blocks;
  const bool leader = cluster.block_rank() == 0 && tid == 0;
  const SampleSlice slice(n, cluster.block_rank(), blocks);
  const RowSampling p = args.rows[row_index];
  float* row = args.logits + row_index * n;

  // Penalties, then suppression (a suppressed token is -inf whatever its penalty); each block
  // changes only its own slice.
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (int j = tid; j < p.penalty_count; j += blockDim.x) {
      const int32_t token = args.penalty_tokens[p.penalty_begin + j];
      const int32_t count = args.penalty_counts[p.penalty_begin + j];
      if (token < slice.lo || token >= slice.hi || count <= 0) continue;
      const float penalty =
          __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, static_cast<float>(count)));
      row[token] = __fsub_rn(row[token], penalty);
    }
  }
  __syncthreads();
  for (int j = tid; j < p.suppressed_count; j += blockDim.x) {
    const int32_t token = args.suppressed[p.suppressed_begin + j];
    if (token >= slice.lo && token < slice.hi) row[token] = -INFINITY;
  }
  // The grammar mask: tokens without their bit (and ids past the mask) can never be chosen.
  if (p.mask_begin >= 0) {
    const uint32_t* mask = args.bitmask + p.mask_begin;
    const int64_t covered = static_cast<int64_t>(args.bitmask_words) * 32;
    for (int64_t i = slice.lo + tid; i < slice.hi; i += blockDim.x)
      if (i >= covered || !((mask[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
  }
  __syncthreads();

  // The best logit (lowest id among equals) and any NaN: thread, warp, block, cluster.
  float best = -INFINITY;
  int best_id = -1, nan = 0;
  sample_for_each(row, slice, [&](int64_t i, float l) {
    if (isnan(l)) nan = 1;
    else if (l > best) {
      best = l;
      best_id = static_cast<int>(i);
    }
  });
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    if (sample_better(other, other_id, best, best_id)) {
      best = other;
      best_id = other_id;
    }
  }
  nan = __any_sync(0xffffffffu, nan);
  if (lane == 0) {
    sh.warp_best[warp] = best;
    sh.warp_best_id[warp] = best_id;
    sh.warp_nan[warp] = nan;
  }
  __syncthreads();
  if (tid == 0) {
    best = -INFINITY;
    best_id = -1;
    nan = 0;
    for (int w = 0; w < kSampleWarps; ++w) {
      nan |= sh.warp_nan[w];
      if (sample_better(sh.warp_best[w], sh.warp_best_id[w], best, best_id)) {
        best = sh.warp_best[w];
        best_id = sh.warp_best_id[w];
      }
    }
    sh.block_best = best;
    sh.block_best_id = best_id;
    sh.block_nan = nan;
  }
  cluster.sync();
  if (tid == 0) {
    best = -INFINITY;
    best_id = -1;
    nan = 0;
    for (unsigned int r = 0; r < blocks; ++r) {
      const float v = *cluster.map_shared_rank(&sh.block_best, r);
      const int id = *cluster.map_shared_rank(&sh.block_best_id, r);
      nan |= *cluster.map_shared_rank(&sh.block_nan, r);
      if (sample_better(v, id, best, best_id)) {
        best = v;
        best_id = id;
      }
    }
    sh.row_best = best;
    sh.row_best_id = best_id;
    sh.row_nan = nan;
  }
  cluster.sync();  // the block values are read everywhere before any block may leave
  best = sh.row_best;
  best_id = sh.row_best_id;
  nan = sh.row_nan;
  if (nan || best_id < 0 || isinf(best)) {
    if (leader) args.ids[row_index] = nan ? kSampledNaN : kSampledNothing;
    return;
  }
  if (!(p.temperature > 0.0f)) {
    if (leader) args.ids[row_index] = best_id;
    return;
  }

  // top_k on the logits: the k-th element in (logit desc, id asc) order.
  SampleCut top_k;
  if (p.top_k > 0 && p.top_k < n) {
    top_k = sample_find_cut(
        sh, row, slice, 64,
        [&](int64_t i, float l, unsigned long long& key, double& mass) {
          key = sample_key(sample_orderable(l), i);
          mass = 1.0;
          return true;
        },
        static_cast<double>(p.top_k), false, false);
  }

  // Weights in place of the logits (0 outside top_k or where exp underflows).
  const float inv_temperature = __fdiv_rn(1.0f, p.temperature);
  sample_transform(row, slice, [&](int64_t i, float l) {
    if (!top_k.admits(sample_key(sample_orderable(l), i))) return 0.0f;
    const float scaled = __fmul_rn(__fsub_rn(l, best), inv_temperature);
    return static_cast<float>(exp(static_cast<double>(scaled)));
  });
  __syncthreads();

  // top_p: the first element in (weight desc, id asc) order whose running mass reaches
  // top_p of the candidates' mass.
  const bool by_weight = p.top_p < 1.0f;
  SampleCut top_p;
  if (by_weight) {
    top_p = sample_find_cut(
        sh, row, slice, 64,
        [&](int64_t i, float w, unsigned long long& key, double& mass) {
          key = sample_key(__float_as_uint(w), i);
          mass = w;
          return w > 0.0f;
        },
        static_cast<double>(p.top_p), true, false);
  }

  // The draw over what top_p and min_p keep: most probable first after top_p, else id order.
  int id_bits = 1;
  while (id_bits < 32 && (int64_t(1) << id_bits) < n) ++id_bits;
  const SampleCut drawn = sample_find_cut(
      sh, row, slice, by_weight ? 64 : id_bits,
      [&](int64_t i, float w, unsigned long long& key, double& mass) {
        if (!(w > 0.0f) || (p.min_p > 0.0f && w < p.min_p)) return false;
        const unsigned long long weight_key = sample_key(__float_as_uint(w), i);
        if (!top_p.admits(weight_key)) return false;
        key = by_weight ? weight_key : static_cast<unsigned long long>(n - 1 - i);
        mass = w;
        return true;
      },
      p.uniform, true, true);
  if (leader) args.ids[row_index] = drawn.id >= 0 ? drawn.id : kSampledNothing;
}

}  // namespace ninfer::cuda::kernels
