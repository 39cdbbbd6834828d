// Per-lane recurrent state of the Gated DeltaNet layers of a hybrid model (model spec §3.3-3.4).
//
// A sequence's state is its KV pages (attention layers) plus, per GDN layer, a conv state
// [K-1, conv_channels] (the last K-1 pre-conv rows of in_proj_qkv's output) and a recurrent
// state [Hv, dk, dv], both fp32. One slot per resident lane holds them for every GDN layer; the
// engine assigns the slot with the lane and resets it between requests. A lane's whole state
// can be saved to and loaded from a flat host buffer (prefix snapshots, pause/restore) or
// copied to another lane (forking a sequence).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

namespace ninfer {

struct GdnStateShape {
  int64_t gdn_layers = 0;
  int64_t conv_kernel = 4;        // K; the conv state keeps K-1 rows
  int64_t conv_channels = 0;      // 2·Hk·dk + Hv·dv
  int64_t value_heads = 0;        // Hv
  int64_t key_dim = 0;            // dk
  int64_t value_dim = 0;          // dv

  int64_t conv_floats() const { return (conv_kernel - 1) * conv_channels; }
  int64_t ssm_floats() const { return value_heads * key_dim * value_dim; }
  int64_t lane_floats() const { return gdn_layers * (conv_floats() + ssm_floats()); }
};

class GdnStateSlots {
 public:
  // All slots start zeroed (an empty prefix). Throws std::invalid_argument on a bad shape.
  GdnStateSlots(const GdnStateShape& shape, int lanes);

  const GdnStateShape& shape() const { return shape_; }
  int lanes() const { return lanes_; }
  int64_t bytes_per_lane() const { return shape_.lane_floats() * int64_t{sizeof(float)}; }

  // State of GDN layer `gdn_layer` (counting GDN layers only) for `lane`.
  float* conv_state(int lane, int64_t gdn_layer);
  float* ssm_state(int lane, int64_t gdn_layer);

  void reset(int lane);
  void copy(int from_lane, int to_lane);
  // The lane's state as lane_floats() values: for each GDN layer, conv then ssm.
  std::vector<float> save(int lane) const;
  void load(int lane, std::span<const float> saved);

 private:
  float* lane_ptr(int lane) const;

  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };

  GdnStateShape shape_;
  int lanes_;
  std::unique_ptr<float, FreeDeleter> storage_;  // calloc: untouched slots cost no memory
};

}  // namespace ninfer
