#include "cache/host_tier.h"

#include <algorithm>
#include <stdexcept>

namespace ninfer {

namespace {

int64_t slabs_for(int64_t bytes, int64_t slab) { return bytes <= 0 ? 0 : (bytes + slab - 1) / slab; }

}  // namespace

HostTier::HostTier(int64_t capacity_bytes, int64_t page_bytes, int64_t snapshot_bytes)
    : page_bytes_(page_bytes),
      snapshot_bytes_(snapshot_bytes),
      snapshot_slabs_(slabs_for(snapshot_bytes, std::max<int64_t>(page_bytes, 1))),
      capacity_slabs_(page_bytes > 0 ? capacity_bytes / page_bytes : 0) {
  if (page_bytes <= 0) throw std::invalid_argument("host tier: a KV page has no bytes");
  // One snapshot and the block it sits on is the least a hit on a hybrid model restores.
  const int64_t least = snapshot_slabs_ + 1;
  if (capacity_slabs_ < least)
    throw std::invalid_argument("--host-context-mib " + std::to_string(capacity_bytes / 1000000) +
                                " is below what one cached prefix needs on the host (" +
                                std::to_string((least * page_bytes + 999999) / 1000000) +
                                " MB: one KV block" + (snapshot_slabs_ ? " and one state snapshot" : "") +
                                "); use 0 to keep the cache on the device only");
  stats_.capacity_bytes = capacity_slabs_ * page_bytes_;
}

const std::byte* HostTier::block(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const {
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.page || it->second.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(), it->second.tokens.end()))
    return nullptr;
  return it->second.page.get();
}

bool HostTier::has_block(uint64_t key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.page;
}

const float* HostTier::snapshot(uint64_t key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second.snapshot.get();
}

int32_t HostTier::children(uint64_t key) const {
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.children;
  // No entry of its own yet: the device evicts leaves first, so children arrive first.
  int32_t n = 0;
  for (const auto& [k, e] : entries_) n += e.page && e.parent == key ? 1 : 0;
  return n;
}

HostTier::Entry& HostTier::entry(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) {
  auto [it, created] = entries_.try_emplace(key);
  if (created) {
    it->second.parent = parent;
    it->second.tokens.assign(tokens.begin(), tokens.end());
    it->second.tick = ++clock_;
    it->second.children = 0;
    for (const auto& [k, e] : entries_)  // children written before their parent (device order)
      if (e.page && e.parent == key) ++it->second.children;
  }
  return it->second;
}

std::byte* HostTier::store_block(uint64_t key, uint64_t parent, std::span<const int32_t> tokens, bool* fresh) {
  *fresh = false;
  if (auto it = entries_.find(key); it != entries_.end() && it->second.page) {
    if (it->second.parent != parent) return nullptr;  // a collision: keep what is there
    return it->second.page.get();
  }
  if (auto it = entries_.find(key); it != entries_.end()) ++it->second.pins;  // survive make_room
  const bool room = make_room(1);
  if (auto it = entries_.find(key); it != entries_.end()) --it->second.pins;
  if (!room) {
    ++stats_.rejected;
    return nullptr;
  }
  Entry& e = entry(key, parent, tokens);
  e.page = std::make_unique<std::byte[]>(static_cast<size_t>(page_bytes_));
  e.tick = ++clock_;
  ++used_slabs_;
  if (auto up = entries_.find(parent); up != entries_.end()) {
    if (is_leaf(up->second)) leaf_erase(parent, up->second);
    ++up->second.children;
  }
  if (is_leaf(e)) leaf_insert(key, e);
  used_changed();
  *fresh = true;
  return e.page.get();
}

float* HostTier::store_snapshot(uint64_t key, uint64_t parent, std::span<const int32_t> tokens, bool* fresh) {
  *fresh = false;
  if (snapshot_slabs_ == 0) return nullptr;
  if (auto it = entries_.find(key); it != entries_.end() && it->second.snapshot) return it->second.snapshot.get();
  if (auto it = entries_.find(key); it != entries_.end()) ++it->second.pins;
  const bool room = make_room(snapshot_slabs_);
  if (auto it = entries_.find(key); it != entries_.end()) --it->second.pins;
  if (!room) {
    ++stats_.rejected;
    return nullptr;
  }
  Entry& e = entry(key, parent, tokens);
  const bool leaf = is_leaf(e);
  if (leaf) leaf_erase(key, e);
  e.snapshot = std::make_unique<float[]>(static_cast<size_t>(snapshot_bytes_ / int64_t{sizeof(float)}));
  e.snapshot_tick = ++clock_;
  snapshot_lru_.insert({e.snapshot_tick, key});
  if (leaf) leaf_insert(key, e);
  used_slabs_ += snapshot_slabs_;
  used_changed();
  *fresh = true;
  return e.snapshot.get();
}

void HostTier::count_write(bool snapshot, int64_t bytes) {
  ++(snapshot ? stats_.image_writes : stats_.block_writes);
  stats_.write_bytes += static_cast<uint64_t>(bytes);
  if (!snapshot) stats_.block_write_bytes += static_cast<uint64_t>(bytes);
}

void HostTier::count_restore(bool snapshot, int64_t bytes) {
  ++(snapshot ? stats_.image_restores : stats_.block_restores);
  stats_.restore_bytes += static_cast<uint64_t>(bytes);
  if (!snapshot) stats_.block_restore_bytes += static_cast<uint64_t>(bytes);
}

void HostTier::touch(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  const bool leaf = is_leaf(e);
  if (leaf) leaf_erase(key, e);
  e.tick = ++clock_;
  if (leaf) leaf_insert(key, e);
  if (e.snapshot) {
    snapshot_lru_.erase({e.snapshot_tick, key});
    e.snapshot_tick = ++clock_;
    snapshot_lru_.insert({e.snapshot_tick, key});
  }
}

void HostTier::pin(uint64_t key) {
  if (auto it = entries_.find(key); it != entries_.end()) ++it->second.pins;
}

void HostTier::unpin(uint64_t key) {
  if (auto it = entries_.find(key); it != entries_.end() && it->second.pins > 0) --it->second.pins;
}

bool HostTier::make_room(int64_t slabs) {
  if (slabs > capacity_slabs_) return false;
  while (capacity_slabs_ - used_slabs_ < slabs)
    if (!evict_one()) return false;
  return true;
}

bool HostTier::evict_one() {
  for (const auto& leaf : leaves_) {
    if (needs_snapshots() && std::get<0>(leaf)) break;  // every remaining leaf leads to a snapshot
    const uint64_t key = std::get<2>(leaf);  // a copy: dropping the block erases `leaf`
    Entry& e = entries_.at(key);
    if (e.pins > 0) continue;
    drop_block(key, e);
    ++stats_.block_evictions;
    erase_if_empty(key);
    return true;
  }
  for (const auto& held : snapshot_lru_) {
    const uint64_t key = held.second;
    Entry& e = entries_.at(key);
    if (e.pins > 0) continue;
    drop_snapshot(key, e);
    ++stats_.snapshot_evictions;
    erase_if_empty(key);
    return true;
  }
  return false;
}

void HostTier::drop_block(uint64_t key, Entry& e) {
  if (!e.page) return;
  if (is_leaf(e)) leaf_erase(key, e);
  e.page.reset();
  --used_slabs_;
  if (auto up = entries_.find(e.parent); up != entries_.end()) {
    --up->second.children;
    if (is_leaf(up->second)) leaf_insert(e.parent, up->second);
    erase_if_empty(e.parent);  // a placeholder that only counted this child
  }
  used_changed();
}

void HostTier::drop_snapshot(uint64_t key, Entry& e) {
  if (!e.snapshot) return;
  const bool leaf = is_leaf(e);
  if (leaf) leaf_erase(key, e);
  snapshot_lru_.erase({e.snapshot_tick, key});
  e.snapshot.reset();
  if (leaf) leaf_insert(key, e);
  used_slabs_ -= snapshot_slabs_;
  used_changed();
}

void HostTier::erase_if_empty(uint64_t key) {
  auto it = entries_.find(key);
  if (it != entries_.end() && !it->second.page && !it->second.snapshot && it->second.children == 0)
    entries_.erase(it);
}

void HostTier::forget_below(uint64_t key) {
  std::unordered_map<uint64_t, std::vector<uint64_t>> below;
  for (const auto& [k, e] : entries_) below[e.parent].push_back(k);
  std::vector<uint64_t> doomed;
  if (auto it = entries_.find(key); it != entries_.end() && !it->second.page) doomed.push_back(key);
  std::vector<uint64_t> frontier{key};
  while (!frontier.empty()) {
    const uint64_t at = frontier.back();
    frontier.pop_back();
    auto it = below.find(at);
    if (it == below.end()) continue;
    for (uint64_t child : it->second) {
      doomed.push_back(child);
      frontier.push_back(child);
    }
  }
  // Deepest first, so each drop finds its parent still counted.
  for (auto it = doomed.rbegin(); it != doomed.rend(); ++it) {
    auto found = entries_.find(*it);
    if (found == entries_.end()) continue;
    Entry& e = found->second;
    drop_snapshot(*it, e);
    drop_block(*it, e);
    e.children = 0;
    entries_.erase(found);
    ++stats_.dead_reclaims;
  }
}

std::vector<HostTier::Record> HostTier::records() const {
  std::unordered_map<uint64_t, std::vector<uint64_t>> below;
  std::vector<uint64_t> roots;
  for (const auto& [k, e] : entries_) {
    if (entries_.count(e.parent)) below[e.parent].push_back(k);
    else roots.push_back(k);
  }
  std::sort(roots.begin(), roots.end());
  std::vector<Record> out;
  std::vector<uint64_t> frontier = roots;
  while (!frontier.empty()) {  // breadth first: parents precede children
    std::vector<uint64_t> next;
    for (uint64_t k : frontier) {
      const Entry& e = entries_.at(k);
      out.push_back({k, e.parent, e.tokens, e.page.get(), e.snapshot.get()});
      auto it = below.find(k);
      if (it == below.end()) continue;
      std::vector<uint64_t> kids = it->second;
      std::sort(kids.begin(), kids.end());
      next.insert(next.end(), kids.begin(), kids.end());
    }
    frontier = std::move(next);
  }
  return out;
}

void HostTier::leaf_insert(uint64_t key, const Entry& e) { leaves_.insert({e.snapshot ? 1 : 0, e.tick, key}); }

void HostTier::leaf_erase(uint64_t key, const Entry& e) { leaves_.erase({e.snapshot ? 1 : 0, e.tick, key}); }

void HostTier::used_changed() { peak_slabs_ = std::max(peak_slabs_, used_slabs_); }

HostTierStats HostTier::stats() const {
  HostTierStats s = stats_;
  s.used_bytes = used_slabs_ * page_bytes_;
  s.peak_bytes = peak_slabs_ * page_bytes_;
  s.snapshots = static_cast<int64_t>(snapshot_lru_.size());
  s.blocks = 0;
  for (const auto& [k, e] : entries_) s.blocks += e.page ? 1 : 0;
  return s;
}

std::string HostTier::check() const {
  int64_t slabs = 0;
  size_t leaves = 0, snapshots = 0;
  std::unordered_map<uint64_t, int32_t> children;
  for (const auto& [k, e] : entries_) {
    if (e.page) {
      ++slabs;
      ++children[e.parent];
    }
    if (e.snapshot) {
      slabs += snapshot_slabs_;
      ++snapshots;
      if (!snapshot_lru_.count({e.snapshot_tick, k})) return "a host snapshot is missing from the eviction order";
    }
    if (!e.page && !e.snapshot && e.children == 0) return "an empty host entry was kept";
    if (e.pins != 0) return "a host entry is still pinned";
  }
  for (const auto& [k, e] : entries_) {
    auto it = children.find(k);
    if ((it == children.end() ? 0 : it->second) != e.children) return "a host entry's child count is wrong";
    if (is_leaf(e)) {
      ++leaves;
      if (!leaves_.count({e.snapshot ? 1 : 0, e.tick, k})) return "a host leaf is missing from the eviction order";
    }
  }
  if (leaves != leaves_.size()) return "the host eviction order holds entries that are not leaves";
  if (snapshots != snapshot_lru_.size()) return "the host snapshot order holds stale entries";
  if (slabs != used_slabs_) return "host slab accounting is off";
  if (used_slabs_ > capacity_slabs_) return "the host tier is over its capacity";
  return {};
}

}  // namespace ninfer
