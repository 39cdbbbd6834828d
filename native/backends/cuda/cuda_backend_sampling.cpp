// CudaBackend::sample_rows: the step's sampling rows and their penalty and suppression lists
// and grammar bitmasks go up as one packed upload from pinned memory, one block per row picks the token
// (kernels_sampling.cuh), and only the ids come back.
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers_sampling.h"

namespace ninfer::cuda {

namespace {

// Byte offsets of the packed batch: rows, penalty tokens, penalty counts, suppressed ids,
// grammar bitmasks, then the ids the kernel writes.
struct SamplingLayout {
  size_t rows = 0, penalty_tokens = 0, penalty_counts = 0, suppressed = 0, bitmask = 0, ids = 0, end = 0;

  explicit SamplingLayout(const SamplingBatch& b) {
    const auto next = [](size_t at, size_t bytes) { return (at + bytes + 15) / 16 * 16; };
    penalty_tokens = next(rows, b.rows.size() * sizeof(RowSampling));
    penalty_counts = next(penalty_tokens, b.penalty_tokens.size() * sizeof(int32_t));
    suppressed = next(penalty_counts, b.penalty_counts.size() * sizeof(int32_t));
    bitmask = next(suppressed, b.suppressed.size() * sizeof(int32_t));
    ids = next(bitmask, b.bitmask.size() * sizeof(uint32_t));
    end = next(ids, b.rows.size() * sizeof(int32_t));
  }
};

template <typename T>
void put(unsigned char* base, size_t offset, const std::vector<T>& values) {
  if (!values.empty()) std::memcpy(base + offset, values.data(), values.size() * sizeof(T));
}

}  // namespace

void CudaBackend::sample_rows(float* logits, int64_t vocab, const SamplingBatch& batch, int32_t* ids) {
  if (mode_ != StepMode::Eager) throw std::logic_error("sample_rows runs after a step, never inside one");
  if (vocab < 1 || vocab > INT32_MAX) throw std::invalid_argument("sample_rows: vocab must be in [1, 2^31)");
  batch.validate();
  const int rows = static_cast<int>(batch.rows.size());
  if (rows == 0) return;
  activate();
  const SamplingLayout layout(batch);
  // The previous call waited for its copies, so the pinned staging is free to overwrite.
  auto* host = static_cast<unsigned char*>(sampling_host_.get(layout.end));
  auto* device = static_cast<unsigned char*>(sampling_device_.get(layout.end));
  put(host, layout.rows, batch.rows);
  put(host, layout.penalty_tokens, batch.penalty_tokens);
  put(host, layout.penalty_counts, batch.penalty_counts);
  put(host, layout.suppressed, batch.suppressed);
  put(host, layout.bitmask, batch.bitmask);
  NINFER_CUDA_CHECK(cudaMemcpyAsync(device, host, layout.ids, cudaMemcpyHostToDevice, stream_));

  SampleRowsArgs args;
  args.logits = logits;
  args.vocab = vocab;
  args.rows = reinterpret_cast<const RowSampling*>(device + layout.rows);
  args.penalty_tokens = reinterpret_cast<const int32_t*>(device + layout.penalty_tokens);
  args.penalty_counts = reinterpret_cast<const int32_t*>(device + layout.penalty_counts);
  args.suppressed = reinterpret_cast<const int32_t*>(device + layout.suppressed);
  args.bitmask = reinterpret_cast<const uint32_t*>(device + layout.bitmask);
  args.bitmask_words = batch.bitmask_words;
  args.ids = reinterpret_cast<int32_t*>(device + layout.ids);
  launch_sample_rows(args, rows, sample_cluster_blocks_ > 0 ? sample_cluster_blocks_ : sample_cluster_blocks(vocab),
                     stream_);

  NINFER_CUDA_CHECK(cudaMemcpyAsync(host + layout.ids, device + layout.ids, static_cast<size_t>(rows) * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream_));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(ids, host + layout.ids, static_cast<size_t>(rows) * sizeof(int32_t));
}

}  // namespace ninfer::cuda
