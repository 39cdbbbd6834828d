// Host entry point of the sampling kernel (kernels_sampling.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/row_sampling.h"

namespace ninfer::cuda {

// Device pointers of one sample_rows call (SamplingBatch's arrays, uploaded).
struct SampleRowsArgs {
  float* logits = nullptr;  // [rows, vocab], scratch: penalised, then overwritten by weights
  int64_t vocab = 0;
  const RowSampling* rows = nullptr;
  const int32_t* penalty_tokens = nullptr;  // distinct tokens within a row
  const int32_t* penalty_counts = nullptr;
  const int32_t* suppressed = nullptr;
  const uint32_t* bitmask = nullptr;  // RowSampling::mask_begin indexes it, bitmask_words each
  int32_t bitmask_words = 0;
  int32_t* ids = nullptr;  // [rows]: the chosen token, or kSampledNaN / kSampledNothing
};

// The thread-block cluster size (blocks per row) for rows of `vocab` logits: 1, 2, 4 or 8.
int sample_cluster_blocks(int64_t vocab);

// One cluster of `cluster_blocks` blocks per row: ids[r] = the Sampler's choice for rows[r]
// (engine/sampler.h). Needs thread-block clusters (sm_90); 16 is beyond the portable size.
void launch_sample_rows(const SampleRowsArgs& args, int rows, int cluster_blocks, cudaStream_t stream);

}  // namespace ninfer::cuda
