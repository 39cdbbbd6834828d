#include "cache/gdn_state_slots.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace ninfer {

GdnStateSlots::GdnStateSlots(const GdnStateShape& shape, int lanes) : shape_(shape), lanes_(lanes) {
  if (lanes < 1) throw std::invalid_argument("GdnStateSlots: lanes must be >= 1");
  if (shape.gdn_layers < 0 || shape.conv_kernel < 1 || shape.conv_channels < 1 ||
      shape.value_heads < 1 || shape.key_dim < 1 || shape.value_dim < 1)
    throw std::invalid_argument("GdnStateSlots: every state dimension must be positive");
  const size_t floats = static_cast<size_t>(shape.lane_floats()) * static_cast<size_t>(lanes);
  storage_.reset(static_cast<float*>(std::calloc(std::max<size_t>(floats, 1), sizeof(float))));
  if (!storage_) throw std::bad_alloc();
}

float* GdnStateSlots::lane_ptr(int lane) const {
  if (lane < 0 || lane >= lanes_)
    throw std::out_of_range("GdnStateSlots: lane " + std::to_string(lane) + " outside [0, " +
                            std::to_string(lanes_) + ")");
  return storage_.get() + static_cast<int64_t>(lane) * shape_.lane_floats();
}

float* GdnStateSlots::conv_state(int lane, int64_t gdn_layer) {
  if (gdn_layer < 0 || gdn_layer >= shape_.gdn_layers)
    throw std::out_of_range("GdnStateSlots: GDN layer " + std::to_string(gdn_layer) +
                            " outside [0, " + std::to_string(shape_.gdn_layers) + ")");
  return lane_ptr(lane) + gdn_layer * (shape_.conv_floats() + shape_.ssm_floats());
}

float* GdnStateSlots::ssm_state(int lane, int64_t gdn_layer) {
  return conv_state(lane, gdn_layer) + shape_.conv_floats();
}

void GdnStateSlots::reset(int lane) {
  std::memset(lane_ptr(lane), 0, static_cast<size_t>(bytes_per_lane()));
}

void GdnStateSlots::copy(int from_lane, int to_lane) {
  if (from_lane == to_lane) {
    lane_ptr(from_lane);  // still validates the lane
    return;
  }
  std::memcpy(lane_ptr(to_lane), lane_ptr(from_lane), static_cast<size_t>(bytes_per_lane()));
}

std::vector<float> GdnStateSlots::save(int lane) const {
  const float* at = lane_ptr(lane);
  return std::vector<float>(at, at + shape_.lane_floats());
}

void GdnStateSlots::load(int lane, std::span<const float> saved) {
  if (static_cast<int64_t>(saved.size()) != shape_.lane_floats())
    throw std::invalid_argument("GdnStateSlots::load: expected " +
                                std::to_string(shape_.lane_floats()) + " floats, got " +
                                std::to_string(saved.size()));
  std::memcpy(lane_ptr(lane), saved.data(), saved.size() * sizeof(float));
}

}  // namespace ninfer
