// The host tier of the prefix cache: block and snapshot images in host memory that outlive
// their device copies.
//
// When the device cache evicts a block (its KV page) or a state snapshot (its slot), the
// engine may write the image here, keyed by the same chain key the device tree uses; a later
// lookup that runs off the end of the device path continues here and copies what it needs
// back into fresh pages and a slot. An entry holds a block image, a snapshot image, or both
// (a snapshot-only entry backs a block still on the device).
//
// Capacity is counted in slabs of one KV page image: a block takes one, a snapshot
// ceil(snapshot bytes / page bytes). The images are separate host allocations; the slab count
// is the budget they share, so blocks and snapshots split it at run time.
//
// Eviction order when a new image needs room:
//   1. block images at the leaves of the host forest that lead to no snapshot here (on a model
//      without recurrent state: every leaf), least recently used first;
//   2. then (models with recurrent state) the least recently used snapshot image; its block
//      then becomes a leaf of step 1 unless something below still needs it.
// Entries pinned by a restore in progress are never evicted. An entry whose parent vanished
// from both tiers can never be reached again and is reclaimed at once (`dead_reclaims`).
//
// Not thread-safe: the engine's worker (under the engine lock) makes every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace ninfer {

struct HostTierStats {
  int64_t capacity_bytes = 0, used_bytes = 0, peak_bytes = 0;  // gauges (peak: since start)
  int64_t blocks = 0, snapshots = 0;                           // images held (gauges)
  uint64_t block_writes = 0, image_writes = 0;      // images written on device eviction
  uint64_t block_restores = 0, image_restores = 0;  // images copied back to the device
  uint64_t write_bytes = 0, restore_bytes = 0;  // both kinds
  uint64_t block_write_bytes = 0, block_restore_bytes = 0;  // KV pages only
  uint64_t write_ns = 0, restore_ns = 0;  // wall time of the copies (bandwidth = bytes / time)
  uint64_t block_evictions = 0, snapshot_evictions = 0;  // images dropped to make room
  uint64_t dead_reclaims = 0;   // entries that became unreachable
  uint64_t rejected = 0;        // images not written: no room even after eviction
};

class HostTier {
 public:
  // `capacity_bytes` is rounded down to whole slabs of `page_bytes`; `snapshot_bytes` is 0 on
  // a model without recurrent state. Throws std::invalid_argument when a snapshot (or, on a
  // dense model, one block) does not fit the budget.
  HostTier(int64_t capacity_bytes, int64_t page_bytes, int64_t snapshot_bytes);

  int64_t page_bytes() const { return page_bytes_; }
  int64_t snapshot_bytes() const { return snapshot_bytes_; }
  bool needs_snapshots() const { return snapshot_bytes_ > 0; }

  // The block image of `key` if its parent and tokens match (a hash collision is a miss).
  const std::byte* block(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const;
  bool has_block(uint64_t key) const;
  const float* snapshot(uint64_t key) const;
  // Entries with a block image whose parent is `key` (host paths continue below it).
  int32_t children(uint64_t key) const;

  // Room for a block image of `key` under `parent`; the caller fills the returned page_bytes()
  // bytes. Null when the tier is full of pinned or more valuable images. An existing image is
  // returned as is (nothing to write: `*fresh` false).
  std::byte* store_block(uint64_t key, uint64_t parent, std::span<const int32_t> tokens, bool* fresh);
  // Room for the snapshot image at the end of block `key` (snapshot_bytes() bytes), likewise.
  // `parent` and `tokens` describe the block, for an entry created by this call.
  float* store_snapshot(uint64_t key, uint64_t parent, std::span<const int32_t> tokens, bool* fresh);
  // The caller wrote or read an image of `bytes` (counters only).
  void count_write(bool snapshot, int64_t bytes);
  void count_restore(bool snapshot, int64_t bytes);
  void count_time(bool restore, uint64_t ns) { (restore ? stats_.restore_ns : stats_.write_ns) += ns; }

  // Marks `key` as recently used (a hit restored or read through it).
  void touch(uint64_t key);
  // Restores in progress hold their path: pinned entries are not evicted.
  void pin(uint64_t key);
  void unpin(uint64_t key);

  // Block `key` left the device without a host copy: every host entry below it is
  // unreachable now, and a snapshot-only entry of `key` itself is useless.
  void forget_below(uint64_t key);

  // Every entry, parents before children where the parent is also here.
  struct Record {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;
    const std::byte* page = nullptr;  // null: snapshot-only entry
    const float* snapshot = nullptr;
  };
  std::vector<Record> records() const;
  // Block images whose key `present` does not report (those only the host holds).
  template <typename Present>
  int64_t blocks_not(Present present) const {
    int64_t n = 0;
    for (const auto& [key, e] : entries_) n += e.page && !present(key) ? 1 : 0;
    return n;
  }

  HostTierStats stats() const;
  // "" when the accounting and eviction order are consistent.
  std::string check() const;

 private:
  struct Entry {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::unique_ptr<std::byte[]> page;
    std::unique_ptr<float[]> snapshot;
    int32_t children = 0;  // entries with a block image whose parent is this one
    int32_t pins = 0;
    uint64_t tick = 0, snapshot_tick = 0;
  };
  using LeafKey = std::tuple<int, uint64_t, uint64_t>;  // (leads to a snapshot, tick, key)

  Entry& entry(uint64_t key, uint64_t parent, std::span<const int32_t> tokens);
  bool make_room(int64_t slabs);
  bool evict_one();
  void drop_block(uint64_t key, Entry& e);
  void drop_snapshot(uint64_t key, Entry& e);
  void erase_if_empty(uint64_t key);
  bool is_leaf(const Entry& e) const { return e.page && e.children == 0; }
  void leaf_insert(uint64_t key, const Entry& e);
  void leaf_erase(uint64_t key, const Entry& e);
  void used_changed();

  const int64_t page_bytes_, snapshot_bytes_, snapshot_slabs_, capacity_slabs_;
  int64_t used_slabs_ = 0, peak_slabs_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
  std::set<LeafKey> leaves_;                              // eviction order of leaf block images
  std::set<std::pair<uint64_t, uint64_t>> snapshot_lru_;  // (snapshot tick, key)
  uint64_t clock_ = 0;
  HostTierStats stats_;
};

}  // namespace ninfer
