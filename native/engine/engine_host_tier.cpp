// The engine's side of the prefix cache's host tier: what the device cache evicts is written to
// host memory when a later hit could use it, and a lookup that runs past the device path
// copies the host part back first (cache/host_tier.h has the tier's own rules).
//
// What is worth writing: on a model without recurrent state every block (a hit needs only the
// blocks); on a hybrid model a block only when a snapshot ends it or a host path continues
// below it, since a hit resumes from a snapshot and a block past the deepest one is never
// read. A block that leaves the device without a host copy takes the host entries below it
// with it (they can no longer be reached: `unbacked_node_losses`, `dead_reclaims`).
#include <algorithm>
#include <chrono>
#include <span>

#include "engine/engine.h"

namespace ninfer {

namespace {

uint64_t since_ns(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

void Engine::install_host_tier() {
  if (!cache_ || options_.host_context_bytes <= 0) return;
  const DType stored = pool_->has_storage() ? pool_->storage().dtype : DType::F32;
  const int64_t page_bytes = pool_->page_bytes(row_bytes(stored, 1));
  const int64_t snapshot_bytes =
      model_->has_recurrent_state() ? model_->snapshot_floats() * static_cast<int64_t>(sizeof(float)) : 0;
  host_ = std::make_unique<HostTier>(options_.host_context_bytes, page_bytes, snapshot_bytes);
  cache_->set_eviction_sink([this](const PrefixCache::Evicted& evicted) { offload_to_host(evicted); });
}

void Engine::offload_to_host(const PrefixCache::Evicted& evicted) {
  HostTier& host = *host_;
  const auto t0 = std::chrono::steady_clock::now();
  if (evicted.slot >= 0 && host.needs_snapshots()) {
    bool fresh = false;
    if (float* image = host.store_snapshot(evicted.key, evicted.parent, evicted.tokens, &fresh); image && fresh) {
      model_->snapshot_io(evicted.slot, image, true);
      host.count_write(true, host.snapshot_bytes());
    }
  }
  if (evicted.page < 0) {  // only the snapshot left the device; its block stays
    host.count_time(false, since_ns(t0));
    return;
  }
  const bool wanted = !host.needs_snapshots() || host.snapshot(evicted.key) != nullptr || host.children(evicted.key) > 0;
  if (wanted) {
    bool fresh = false;
    if (std::byte* image = host.store_block(evicted.key, evicted.parent, evicted.tokens, &fresh); image && fresh) {
      model_->kv_page_io(evicted.page, image, true);
      host.count_write(false, host.page_bytes());
    }
  }
  host.count_time(false, since_ns(t0));
  if (!host.has_block(evicted.key)) {
    ++unbacked_node_losses_;
    host.forget_below(evicted.key);
  }
}

void Engine::restore_from_host(const Sequence& seq, int32_t limit) {
  HostTier& host = *host_;
  const std::span<const int32_t> tokens(seq.history);
  const auto device = cache_->path(tokens, limit);
  const int32_t on_device = static_cast<int32_t>(device.size());
  const bool hybrid = cache_->needs_snapshots();
  const int32_t max_blocks = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size())) / kPageTokens;
  auto block_tokens = [&](int32_t b) { return tokens.subspan(static_cast<size_t>(b) * kPageTokens, kPageTokens); };

  // The path continues on the host where the device's ends.
  std::vector<uint64_t> keys;  // every path block's key, device part first
  for (const auto& b : device) keys.push_back(b.key);
  for (int32_t b = on_device; b < max_blocks; ++b) {
    const uint64_t parent = keys.empty() ? cache_->root_key() : keys.back();
    const uint64_t key = cache_->chain_key(parent, block_tokens(b));
    if (!host.block(key, parent, block_tokens(b))) break;
    keys.push_back(key);
  }
  const int32_t total = static_cast<int32_t>(keys.size());
  auto device_snapshot = [&](int32_t depth) { return depth <= on_device && device[depth - 1].slot >= 0; };
  // The deepest depth at most `cap` a hit can resume from, and the device's own best.
  auto deepest = [&](int32_t cap) {
    if (!hybrid) return cap;
    for (int32_t d = cap; d > 0; --d)
      if (device_snapshot(d) || host.snapshot(keys[static_cast<size_t>(d - 1)])) return d;
    return 0;
  };
  int32_t device_best = 0;
  if (!hybrid) device_best = on_device;
  else
    for (int32_t d = on_device; d > 0 && device_best == 0; --d)
      if (device_snapshot(d)) device_best = d;
  int32_t best = deepest(total);
  if (best <= device_best) return;

  // Hold the path while eviction makes room: device pages by reference, host entries by pin.
  for (const auto& b : device) pool_->retain(b.page);
  for (uint64_t key : keys) host.pin(key);
  const int64_t wanted = std::max<int32_t>(best - on_device, 0);
  while (pool_->free_pages() < wanted && cache_->evict_one()) {
  }
  if (pool_->free_pages() < wanted) best = deepest(on_device + static_cast<int32_t>(pool_->free_pages()));
  if (best > device_best) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t parent = on_device > 0 ? keys[static_cast<size_t>(on_device - 1)] : cache_->root_key();
    bool whole = true;
    for (int32_t b = on_device; b < best && whole; ++b) {
      const uint64_t key = keys[static_cast<size_t>(b)];
      auto page = pool_->allocate(1);
      model_->kv_page_io(page->front(), const_cast<std::byte*>(host.block(key, parent, block_tokens(b))), false);
      whole = cache_->adopt(parent, block_tokens(b), page->front()) == key;  // takes the page
      host.count_restore(false, host.page_bytes());
      host.touch(key);
      parent = key;
    }
    const uint64_t at = keys[static_cast<size_t>(best - 1)];
    if (whole && hybrid && !device_snapshot(best)) {
      const int slot = cache_->acquire_slot();  // may move another snapshot to the host
      if (slot >= 0) {
        model_->snapshot_io(slot, const_cast<float*>(host.snapshot(at)), false);
        cache_->attach_snapshot(at, slot);
        host.count_restore(true, host.snapshot_bytes());
      }
    }
    host.touch(at);
    host.count_time(true, since_ns(t0));
  }
  for (uint64_t key : keys) host.unpin(key);
  for (const auto& b : device) pool_->release(b.page);
}

}  // namespace ninfer
