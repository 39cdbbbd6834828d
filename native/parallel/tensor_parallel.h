// What a model needs to know to run as one rank of a tensor-parallel group (Megatron-style):
// attention heads, MLP columns and the vocabulary split evenly across the ranks, one
// all-reduce after each row-parallel projection (attention out, MLP down), one all-gather of
// the vocabulary-parallel logits.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "parallel/collective.h"

namespace ninfer {

struct TensorParallelRank {
  int rank = 0;
  int size = 1;
  Collective* collective = nullptr;  // the rank's member of the group; null = no parallelism

  bool active() const { return collective != nullptr && size > 1; }

  // `total` units split evenly: this rank's count (throws naming `what` unless divisible).
  int64_t share(int64_t total, const std::string& what) const {
    if (total % size != 0)
      throw std::runtime_error("--tensor-parallel-size " + std::to_string(size) + " must divide " + what + " (" +
                               std::to_string(total) + ")");
    return total / size;
  }
  // Key/value heads this rank keeps: its share, or one replicated head when the group is
  // larger than the head count (each rank then keeps the head its query heads read).
  int64_t kv_heads(int64_t heads, int64_t kv_heads) const {
    if (kv_heads >= size) return share(kv_heads, "num_key_value_heads");
    if (size % kv_heads != 0 || heads % size != 0)
      throw std::runtime_error("--tensor-parallel-size " + std::to_string(size) +
                               " must be a multiple of num_key_value_heads (" + std::to_string(kv_heads) +
                               ") and divide num_attention_heads (" + std::to_string(heads) + ")");
    return 1;
  }
  // The first key/value head of this rank's kv_heads(heads, kv_heads).
  int64_t first_kv_head(int64_t heads, int64_t kv_heads) const {
    if (kv_heads >= size) return rank * (kv_heads / size);
    return (rank * (heads / size)) / (heads / kv_heads);
  }
};

}  // namespace ninfer
