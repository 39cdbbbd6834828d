// Launchers of the KV-write and attention kernels (see launchers.h).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_decode_attention.cuh"
#include "backends/cuda/kernels_kv_quant.cuh"
#include "backends/cuda/kernels_prefill_attention.cuh"
#include "backends/cuda/launchers.h"

namespace ninfer::cuda {

namespace {

// Keys each thread group takes per iteration of the decode kernel.
constexpr int kDecodeKeysPerIteration = 2;

template <int HD, int G, int F>
void decode_grouped_format(const kernels::DecodeParams& p, const dim3& grid, cudaStream_t stream) {
  kernels::decode_attention<HD, G, kDecodeKeysPerIteration, F><<<grid, kernels::kDecodeThreads, 0, stream>>>(p);
}

template <int HD, int G>
void decode_grouped(const kernels::DecodeParams& p, int num_items, int num_kv_heads, cudaStream_t stream) {
  const int group_chunks = (p.group + G - 1) / G;
  const dim3 grid(static_cast<unsigned int>(num_items), static_cast<unsigned int>(num_kv_heads * group_chunks),
                  static_cast<unsigned int>(p.splits));
  switch (p.kv.kv_dtype) {
    case kernels::kKvBf16: decode_grouped_format<HD, G, kernels::kKvBf16>(p, grid, stream); break;
    case kernels::kKvFp8: decode_grouped_format<HD, G, kernels::kKvFp8>(p, grid, stream); break;
    case kernels::kKvInt8: decode_grouped_format<HD, G, kernels::kKvInt8>(p, grid, stream); break;
    case kernels::kKvNvfp4: decode_grouped_format<HD, G, kernels::kKvNvfp4>(p, grid, stream); break;
    default: throw std::invalid_argument("decode attention: unknown KV format");
  }
  NINFER_CUDA_CHECK_LAUNCH();
}

template <int HD>
void decode_for(const kernels::DecodeParams& p, int num_items, int num_kv_heads, cudaStream_t stream) {
  // The smallest power-of-two head count that covers the GQA group (at most kDecodeMaxGroup;
  // larger groups take several blocks per KV head).
  if (p.group <= 1)
    decode_grouped<HD, 1>(p, num_items, num_kv_heads, stream);
  else if (p.group <= 2)
    decode_grouped<HD, 2>(p, num_items, num_kv_heads, stream);
  else if (p.group <= 4)
    decode_grouped<HD, 4>(p, num_items, num_kv_heads, stream);
  else
    decode_grouped<HD, kernels::kDecodeMaxGroup>(p, num_items, num_kv_heads, stream);
  if (p.splits > 1) {
    const dim3 combine_grid(static_cast<unsigned int>(num_items), static_cast<unsigned int>(p.num_heads));
    const size_t weights_bytes = static_cast<size_t>(p.splits) * sizeof(float);
    if (weights_bytes > 48 * 1024) throw std::invalid_argument("decode attention: too many key splits");
    kernels::combine_splits<HD><<<combine_grid, HD, weights_bytes, stream>>>(p.items, p.partials, p.num_heads, p.splits,
                                                                            p.out);
    NINFER_CUDA_CHECK_LAUNCH();
  }
}

template <int HD, int kStages, int F>
void prefill_format(const kernels::PrefillParams& p, int num_items, cudaStream_t stream) {
  using Config = kernels::PrefillConfig<HD, kStages>;
  static const bool configured = [] {
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(kernels::prefill_attention<HD, kStages, F>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Config::kSmemBytes)));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned int>(p.num_heads), static_cast<unsigned int>(num_items));
  kernels::prefill_attention<HD, kStages, F><<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p);
  NINFER_CUDA_CHECK_LAUNCH();
}

template <int HD, int kStages>
void prefill_for(const kernels::PrefillParams& p, int num_items, cudaStream_t stream) {
  switch (p.kv.kv_dtype) {
    case kernels::kKvBf16: prefill_format<HD, kStages, kernels::kKvBf16>(p, num_items, stream); break;
    case kernels::kKvFp8: prefill_format<HD, kStages, kernels::kKvFp8>(p, num_items, stream); break;
    case kernels::kKvInt8: prefill_format<HD, kStages, kernels::kKvInt8>(p, num_items, stream); break;
    case kernels::kKvNvfp4: prefill_format<HD, kStages, kernels::kKvNvfp4>(p, num_items, stream); break;
    default: throw std::invalid_argument("prefill attention: unknown KV format");
  }
}

template <int HD>
void prefill_for(const kernels::PrefillParams& p, int num_items, int kv_stages, cudaStream_t stream) {
  if (kv_stages == 1)
    prefill_for<HD, 1>(p, num_items, stream);
  else
    prefill_for<HD, 2>(p, num_items, stream);
}

}  // namespace

bool attention_head_dim_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

void launch_kv_write(const KvLayout& kv, int64_t head_dim, const float* k, const float* v, const int32_t* slots,
                     int64_t rows, cudaStream_t stream) {
  if (rows <= 0) return;
  if (kv.kv_dtype != kernels::kKvBf16) {
    const auto grid = static_cast<unsigned int>(rows);
    const unsigned int threads = 32u * static_cast<unsigned int>(std::min<int64_t>(2 * kv.num_kv_heads, 16));
    auto launch = [&]<int F>() {
      switch (head_dim) {
        case 64: kernels::kv_write_quantized<F, 64><<<grid, threads, 0, stream>>>(kv, k, v, slots); break;
        case 128: kernels::kv_write_quantized<F, 128><<<grid, threads, 0, stream>>>(kv, k, v, slots); break;
        case 256: kernels::kv_write_quantized<F, 256><<<grid, threads, 0, stream>>>(kv, k, v, slots); break;
        default: throw std::invalid_argument("CUDA KV write: head_dim " + std::to_string(head_dim));
      }
    };
    switch (kv.kv_dtype) {
      case kernels::kKvFp8: launch.template operator()<kernels::kKvFp8>(); break;
      case kernels::kKvInt8: launch.template operator()<kernels::kKvInt8>(); break;
      case kernels::kKvNvfp4: launch.template operator()<kernels::kKvNvfp4>(); break;
      default: throw std::invalid_argument("CUDA KV write: unknown KV format");
    }
    NINFER_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t width = kv.num_kv_heads * head_dim;
  const int threads = width >= 512 ? 512 : 128;
  kernels::kv_write<<<static_cast<unsigned int>(rows), threads, 0, stream>>>(kv, static_cast<int>(head_dim), k, v,
                                                                             slots);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_decode_attention(const AttentionArgs& a, const DecodeItem* items, int num_items, int splits, int chunk,
                             float* partials, cudaStream_t stream) {
  if (num_items <= 0) return;
  if (splits < 1 || (splits > 1 && (!partials || chunk % 64 != 0)))
    throw std::invalid_argument("launch_decode_attention: bad split configuration");
  kernels::DecodeParams p{a.kv, a.pages, items, a.q, a.out, partials, a.num_heads,
                          a.num_heads / a.kv.num_kv_heads, splits, chunk, a.scale};
  switch (a.head_dim) {
    case 64: decode_for<64>(p, num_items, a.kv.num_kv_heads, stream); break;
    case 128: decode_for<128>(p, num_items, a.kv.num_kv_heads, stream); break;
    case 256: decode_for<256>(p, num_items, a.kv.num_kv_heads, stream); break;
    default: throw std::invalid_argument("CUDA attention: head_dim " + std::to_string(a.head_dim) + " is not supported");
  }
}

void launch_prefill_attention(const AttentionArgs& a, const PrefillItem* items, int num_items, cudaStream_t stream,
                              PrefillKernelConfig config) {
  if (num_items <= 0) return;
  // Measured on an H200 (bench/bench_cuda_attention.py): double-buffered K/V pays only at
  // head_dim 64; at 128 and 256 single buffers leave room for more resident blocks.
  const int kv_stages = config.kv_stages != 0 ? config.kv_stages : (a.head_dim == 64 ? 2 : 1);
  if (kv_stages != 1 && kv_stages != 2)
    throw std::invalid_argument("prefill attention: " + std::to_string(kv_stages) + " K/V stages (1 or 2)");
  kernels::PrefillParams p{a.kv, a.pages, items, a.q, a.out, a.num_heads, a.num_heads / a.kv.num_kv_heads, a.scale};
  switch (a.head_dim) {
    case 64: prefill_for<64>(p, num_items, kv_stages, stream); break;
    case 128: prefill_for<128>(p, num_items, kv_stages, stream); break;
    case 256: prefill_for<256>(p, num_items, kv_stages, stream); break;
    default: throw std::invalid_argument("CUDA attention: head_dim " + std::to_string(a.head_dim) + " is not supported");
  }
}

}  // namespace ninfer::cuda
