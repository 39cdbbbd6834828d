#include "models/toy_model.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/sampler.h"

namespace ninfer {

ToyModel::ToyModel(int64_t vocab_size, KvPool& pool, int max_lanes, int64_t max_positions)
    : pool_(pool), lane_positions_(static_cast<size_t>(max_lanes), 0) {
  if (vocab_size < 3) throw std::invalid_argument("toy model needs a vocabulary of at least 3 tokens");
  if (max_lanes < 1) throw std::invalid_argument("toy model needs at least one lane");
  if (pool.num_layers() != kLayers || pool.num_kv_heads() != kHeads || pool.head_dim() != kHeadDim)
    throw std::invalid_argument("toy model needs a KV pool with 1 layer, 1 head, head_dim 1");
  // The toy model runs on no backend; it keeps its "KV" (token ids) in host float32 pages.
  if (pool.quantized()) throw std::invalid_argument("toy model needs a bf16 (unquantized) KV pool");
  if (!pool.has_storage()) {
    const auto elems = static_cast<size_t>(pool.storage_elems());
    pool.attach_storage({std::shared_ptr<void>(new float[elems](), std::default_delete<float[]>()), DType::F32, "cpu"});
  } else if (pool.storage().device != "cpu" || pool.storage().dtype != DType::F32) {
    throw std::invalid_argument("toy model needs a KV pool with host float32 storage");
  }
  info_.architecture = "toy";
  info_.vocab_size = vocab_size;
  info_.hidden_size = 1;
  info_.num_layers = kLayers;
  info_.num_kv_layers = kLayers;
  info_.num_kv_heads = kHeads;
  info_.head_dim = kHeadDim;
  info_.max_position_embeddings = max_positions;
  info_.weight_format = "none";
}

void ToyModel::reset_lane(int lane) {
  if (lane < 0 || lane >= static_cast<int>(lane_positions_.size()))
    throw std::logic_error("toy model: reset of unknown lane " + std::to_string(lane));
  lane_positions_[static_cast<size_t>(lane)] = 0;
}

void ToyModel::resume_lane(int lane, int32_t position, int) {
  reset_lane(lane);
  if (position < 0) throw std::logic_error("toy model: resume at a negative position");
  lane_positions_[static_cast<size_t>(lane)] = position;
}

void ToyModel::forward(const BatchPlan& plan, float* logits) {
  ++forwards_;
  if (const int64_t us = step_delay_us_.load(); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  if (failures_to_inject_.load() > 0) {
    failures_to_inject_.fetch_sub(1);
    throw std::runtime_error("toy model: injected failure");
  }
  size_t offset = 0;
  std::vector<bool> lane_seen(lane_positions_.size(), false);
  for (const auto& s : plan.slices) {
    if (s.lane < 0 || s.lane >= static_cast<int>(lane_positions_.size()))
      throw std::logic_error("toy model: slice for unknown lane " + std::to_string(s.lane));
    if (lane_seen[static_cast<size_t>(s.lane)])
      throw std::logic_error("toy model: lane " + std::to_string(s.lane) + " appears twice in one plan");
    lane_seen[static_cast<size_t>(s.lane)] = true;
    auto& cached = lane_positions_[static_cast<size_t>(s.lane)];
    if (s.start_pos != cached)
      throw std::logic_error("toy model: lane " + std::to_string(s.lane) + " slice starts at " +
                             std::to_string(s.start_pos) + " but the lane holds " + std::to_string(cached) +
                             " tokens");
    if (s.num_tokens < 1) throw std::logic_error("toy model: empty slice");
    if (static_cast<int64_t>(s.num_pages) * kPageTokens < s.start_pos + s.num_tokens)
      throw std::logic_error("toy model: page table too short for the slice");
    if (offset + static_cast<size_t>(s.num_tokens) > plan.tokens.size())
      throw std::logic_error("toy model: slices ask for more tokens than the plan holds");
    for (int32_t t = 0; t < s.num_tokens; ++t) {
      const int32_t token = plan.tokens[offset + static_cast<size_t>(t)];
      if (token < 0 || token >= info_.vocab_size) throw std::logic_error("toy model: token outside vocabulary");
      const int32_t pos = s.start_pos + t;
      pool_.key_page(0, s.page_table[pos / kPageTokens])[pos % kPageTokens] = static_cast<float>(token);
    }
    offset += static_cast<size_t>(s.num_tokens);
    cached += s.num_tokens;
  }
  if (offset != plan.tokens.size()) throw std::logic_error("toy model: plan holds tokens no slice covers");

  const int64_t vocab = info_.vocab_size;
  float* row = logits;
  for (const auto& s : plan.slices) {
    for (int32_t t = s.num_tokens - s.logit_rows(); t < s.num_tokens; ++t) {
      const int32_t next = next_token(s, s.start_pos + t);
      std::fill(row, row + vocab, 0.0f);
      row[next] = 6.0f;
      row[(next + 1) % vocab] = 4.0f;
      row[(next + 2) % vocab] = 3.0f;
      if (rows_to_poison_.load() > 0) {
        rows_to_poison_.fetch_sub(1);
        std::fill(row, row + vocab, poison_value_.load());
      }
      row += vocab;
    }
  }
}

void ToyModel::keep_prefix(int lane, int32_t length) {
  if (lane < 0 || lane >= static_cast<int>(lane_positions_.size()))
    throw std::logic_error("toy model: keep_prefix of unknown lane " + std::to_string(lane));
  auto& cached = lane_positions_[static_cast<size_t>(lane)];
  if (length < 1 || length > cached)
    throw std::logic_error("toy model: keep_prefix(" + std::to_string(length) + ") but the lane holds " +
                           std::to_string(cached) + " tokens");
  cached = length;
}

void ToyModel::forward_sampled(const BatchPlan& plan, const SamplingBatch& sampling, int32_t* ids) {
  check_sampling_rows(plan, sampling);
  std::vector<float> logits(sampling.rows.size() * static_cast<size_t>(info_.vocab_size));
  forward(plan, logits.data());
  for (size_t r = 0; r < sampling.rows.size(); ++r)
    ids[r] = sample_row_on_host(std::span(logits).subspan(r * static_cast<size_t>(info_.vocab_size),
                                                          static_cast<size_t>(info_.vocab_size)),
                                sampling, r);
}

int32_t ToyModel::next_token(const SeqSlice& slice, int32_t pos) const {
  int64_t mix = 0;
  int32_t token = 0;
  for (int32_t i = 0; i <= pos; ++i) {
    token = static_cast<int32_t>(pool_.key_page(0, slice.page_table[i / kPageTokens])[i % kPageTokens]);
    mix += static_cast<int64_t>(token) * (i % 13 + 1);
  }
  return static_cast<int32_t>((31 * static_cast<int64_t>(token) + 7 * static_cast<int64_t>(pos) + mix) %
                              info_.vocab_size);
}

}  // namespace ninfer
