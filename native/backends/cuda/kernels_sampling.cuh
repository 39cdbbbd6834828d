// Token selection on the device, one thread block per logit row: the engine's Sampler
// (engine/sampler.h) with the row's draw given, so that only the chosen ids leave the device.
//
// The Sampler sorts; a block cannot sort 248k candidates cheaply, but every decision the
// Sampler makes is "the first element, in some total order, at which a running sum reaches a
// target": top_k (count k, order logit desc / id asc), top_p (mass top_p · total, order weight
// desc / id asc), the draw (mass u · total, strictly exceeded; weight order after top_p, else
// id order). find_cut answers each with a most-significant-digit-first radix search on a
// 64-bit key that encodes the order (value bits, then the inverted id): one pass over the row
// per 8-bit digit builds a histogram of counts and masses of the elements that share the
// prefix found so far, and one warp picks the digit where the running sum crosses the target.
// The search stops as soon as that digit holds one element (or, for >=, when the sum lands on
// the target exactly), so a few passes usually settle it. Masses are summed in double, in an
// order that differs from the Sampler's sequential sums only by rounding.
//
// Arithmetic that decides membership is the Sampler's, rounded the same way: penalties and
// the temperature scaling use explicitly rounded float ops (no contraction into FMAs), and the
// weight exp((l - max) / T) is evaluated in double and rounded to float, which agrees with the
// host's expf except where that is off by its last bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels_common.cuh"
#include "backends/cuda/launchers_sampling.h"
#include "common/row_sampling.h"

namespace ninfer::cuda::kernels {

inline constexpr int kSampleThreads = 1024;
inline constexpr int kSampleDigitBits = 8;
inline constexpr int kSampleBuckets = 1 << kSampleDigitBits;
inline constexpr int kSampleHistCopies = 4;  // warps spread their atomics over this many histograms

struct SampleShared {
  unsigned int count[kSampleHistCopies][kSampleBuckets];
  double mass[kSampleHistCopies][kSampleBuckets];
  int id[kSampleHistCopies][kSampleBuckets];
  float best_value[kSampleThreads / 32];
  int best_id[kSampleThreads / 32];
  int saw_nan[kSampleThreads / 32];
  // find_cut's state, written by warp 0 between passes
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

// Finds the first element, in descending key order among the elements `element` admits, whose
// running mass reaches `target` (>=, or > when strict); target = fraction · (total admitted
// mass) when relative. Falls back to the last element when rounding leaves the target out of
// reach. element(i, key, mass) -> bool. Every thread of the block calls it.
template <typename Element>
__device__ SampleCut sample_find_cut(SampleShared& sh, int64_t n, int key_bits, Element element, double target_value,
                                     bool relative, bool strict) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  const int copy = (tid >> 5) % kSampleHistCopies;
  unsigned long long prefix = 0;
  int shift = key_bits;
  double above = 0.0, target = target_value;  // warp 0's copies
  bool first_pass = true;
  for (;;) {
    const int bits = min(kSampleDigitBits, shift);
    const int next_shift = shift - bits;
    const unsigned int digit_mask = (1u << bits) - 1u;
    for (int j = tid; j < kSampleHistCopies * kSampleBuckets; j += blockDim.x) {
      (&sh.count[0][0])[j] = 0;
      (&sh.mass[0][0])[j] = 0.0;
      (&sh.id[0][0])[j] = -1;
    }
    __syncthreads();
    // Runs of one digit are summed in registers first: a peaked row puts most elements in one
    // bucket, and shared atomics on one address serialise.
    int run_digit = -1, run_id = -1;
    unsigned int run_count = 0;
    double run_mass = 0.0;
    auto flush = [&] {
      if (run_count == 0) return;
      atomicAdd(&sh.count[copy][run_digit], run_count);
      atomicAdd(&sh.mass[copy][run_digit], run_mass);
      sh.id[copy][run_digit] = run_id;  // read only where the bucket holds one element
    };
    for (int64_t i = tid; i < n; i += blockDim.x) {
      unsigned long long key;
      double m;
      if (!element(i, key, m)) continue;
      if (shift < 64 && (key >> shift) != prefix) continue;
      const int d = static_cast<int>((key >> next_shift) & digit_mask);
      if (d != run_digit) {
        flush();
        run_digit = d;
        run_count = 0;
        run_mass = 0.0;
      }
      ++run_count;
      run_mass += m;
      run_id = static_cast<int>(i);
    }
    flush();
    __syncthreads();
    if (tid < 32) {
      // Lane l holds buckets 255 - 8l ... 248 - 8l: lanes in descending digit order.
      constexpr int kPerLane = kSampleBuckets / 32;
      unsigned int c[kPerLane];
      double m[kPerLane];
      int ids[kPerLane];
      double lane_mass = 0.0;
#pragma unroll
      for (int b = 0; b < kPerLane; ++b) {
        const int d = kSampleBuckets - 1 - (lane * kPerLane + b);
        c[b] = 0;
        m[b] = 0.0;
        ids[b] = -1;
#pragma unroll
        for (int k = 0; k < kSampleHistCopies; ++k) {
          c[b] += sh.count[k][d];
          m[b] += sh.mass[k][d];
          ids[b] = max(ids[b], sh.id[k][d]);
        }
        lane_mass += m[b];
      }
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
        if (c[b] == 0) continue;
        const double through = running + m[b];
        if (hit < 0 && (strict ? through > target : through >= target)) {
          hit = b;
          hit_above = running;
        }
        last = b;
        last_above = running;
        running = through;
      }
      const unsigned int hits = __ballot_sync(0xffffffffu, hit >= 0);
      const unsigned int nonempty = __ballot_sync(0xffffffffu, last >= 0);
      // The first lane that crosses; else (rounding) the last non-empty bucket.
      const int owner = hits ? __ffs(hits) - 1 : (nonempty ? 31 - __clz(nonempty) : 0);
      if (lane == owner) {
        const int b = hits ? hit : last;
        const double bucket_above = hits ? hit_above : last_above;
        if (b < 0) {  // nothing admitted at all
          sh.done = 1;
          sh.found_id = -1;
          sh.shift = 64;
          sh.prefix = 0;
        } else {
          const int d = kSampleBuckets - 1 - (lane * kPerLane + b);
          const bool lands_exactly = !strict && hits && bucket_above + m[b] == target;
          sh.prefix = (shift >= 64 ? 0ull : prefix << bits) | static_cast<unsigned long long>(d);
          sh.shift = next_shift;
          sh.above = bucket_above;
          sh.found_id = c[b] == 1 ? ids[b] : -1;
          sh.done = c[b] == 1 || next_shift == 0 || lands_exactly;
        }
      }
      __syncwarp();
    }
    __syncthreads();
    prefix = sh.prefix;
    shift = sh.shift;
    above = sh.above;
    first_pass = false;
    if (sh.done) {
      SampleCut cut;
      cut.prefix = prefix;
      cut.shift = shift;
      cut.id = sh.found_id;
      __syncthreads();  // every thread has read sh before a later search rewrites it
      return cut;
    }
    // Not done: warp 0 rewrites sh only after the next pass's barriers, so this read is safe.
  }
}

__global__ void __launch_bounds__(kSampleThreads) sample_rows_kernel(SampleRowsArgs args) {
  __shared__ SampleShared sh;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t n = args.vocab;
  const RowSampling p = args.rows[blockIdx.x];
  float* row = args.logits + static_cast<int64_t>(blockIdx.x) * n;

  // Penalties, then suppression (a suppressed token is -inf whatever its penalty).
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (int j = tid; j < p.penalty_count; j += blockDim.x) {
      const int32_t token = args.penalty_tokens[p.penalty_begin + j];
      const int32_t count = args.penalty_counts[p.penalty_begin + j];
      if (token < 0 || token >= n || count <= 0) continue;
      const float penalty =
          __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, static_cast<float>(count)));
      row[token] = __fsub_rn(row[token], penalty);
    }
  }
  __syncthreads();
  for (int j = tid; j < p.suppressed_count; j += blockDim.x) {
    const int32_t token = args.suppressed[p.suppressed_begin + j];
    if (token >= 0 && token < n) row[token] = -INFINITY;
  }
  __syncthreads();

  // The best logit (lowest id among equals) and any NaN.
  float best = -INFINITY;
  int best_id = -1, nan = 0;
  for (int64_t i = tid; i < n; i += blockDim.x) {
    const float l = row[i];
    if (isnan(l)) nan = 1;
    else if (l > best) {
      best = l;
      best_id = static_cast<int>(i);
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    if (other > best || (other == best && other_id >= 0 && (best_id < 0 || other_id < best_id))) {
      best = other;
      best_id = other_id;
    }
  }
  nan = __any_sync(0xffffffffu, nan);
  if (lane == 0) {
    sh.best_value[warp] = best;
    sh.best_id[warp] = best_id;
    sh.saw_nan[warp] = nan;
  }
  __syncthreads();
  best = sh.best_value[0];
  best_id = sh.best_id[0];
  nan = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    nan |= sh.saw_nan[w];
    const float v = sh.best_value[w];
    const int id = sh.best_id[w];
    if (v > best || (v == best && id >= 0 && (best_id < 0 || id < best_id))) {
      best = v;
      best_id = id;
    }
  }
  if (nan || best_id < 0 || isinf(best)) {
    if (tid == 0) args.ids[blockIdx.x] = nan ? kSampledNaN : kSampledNothing;
    return;
  }
  if (!(p.temperature > 0.0f)) {
    if (tid == 0) args.ids[blockIdx.x] = best_id;
    return;
  }

  // top_k on the logits: the k-th element in (logit desc, id asc) order.
  SampleCut top_k;
  if (p.top_k > 0 && p.top_k < n) {
    top_k = sample_find_cut(
        sh, n, 64,
        [&](int64_t i, unsigned long long& key, double& mass) {
          key = sample_key(sample_orderable(row[i]), i);
          mass = 1.0;
          return true;
        },
        static_cast<double>(p.top_k), false, false);
  }

  // Weights in place of the logits (0 outside top_k or where exp underflows).
  const float inv_temperature = __fdiv_rn(1.0f, p.temperature);
  for (int64_t i = tid; i < n; i += blockDim.x) {
    const float l = row[i];
    float w = 0.0f;
    if (top_k.admits(sample_key(sample_orderable(l), i))) {
      const float scaled = __fmul_rn(__fsub_rn(l, best), inv_temperature);
      w = static_cast<float>(exp(static_cast<double>(scaled)));
    }
    row[i] = w;
  }
  __syncthreads();

  // top_p: the first element in (weight desc, id asc) order whose running mass reaches
  // top_p of the candidates' mass.
  const bool by_weight = p.top_p < 1.0f;
  SampleCut top_p;
  if (by_weight) {
    top_p = sample_find_cut(
        sh, n, 64,
        [&](int64_t i, unsigned long long& key, double& mass) {
          const float w = row[i];
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
      sh, n, by_weight ? 64 : id_bits,
      [&](int64_t i, unsigned long long& key, double& mass) {
        const float w = row[i];
        if (!(w > 0.0f) || (p.min_p > 0.0f && w < p.min_p)) return false;
        const unsigned long long weight_key = sample_key(__float_as_uint(w), i);
        if (!top_p.admits(weight_key)) return false;
        key = by_weight ? weight_key : static_cast<unsigned long long>(n - 1 - i);
        mass = w;
        return true;
      },
      p.uniform, true, true);
  if (tid == 0) args.ids[blockIdx.x] = drawn.id >= 0 ? drawn.id : kSampledNothing;
}

}  // namespace ninfer::cuda::kernels
