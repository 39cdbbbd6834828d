#include "cache/prefix_cache.h"

#include <algorithm>
#include <stdexcept>

namespace ninfer {

namespace {

uint64_t mix(uint64_t x) {
  // splitmix64's finaliser: every input bit reaches every output bit.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

PrefixCache::PrefixCache(KvPool& pool, uint64_t identity, int slots, bool needs_snapshots)
    : pool_(pool), identity_(mix(identity ^ 0x6e696e6665722d31ULL)), needs_snapshots_(needs_snapshots) {
  if (slots < 0) throw std::invalid_argument("PrefixCache: negative snapshot slot count");
  total_slots_ = slots;
  for (int s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

PrefixCache::~PrefixCache() {
  for (auto& [key, node] : nodes_) pool_.release(node.page);
}

uint64_t PrefixCache::chain_key(uint64_t parent, std::span<const int32_t> block) const {
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ULL);
  for (int32_t t : block) h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL));
  return h == 0 ? 1 : h;  // 0 stays "no node"
}

std::pair<int32_t, uint64_t> PrefixCache::walk(std::span<const int32_t> tokens, int32_t limit) const {
  const int32_t max_blocks = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size())) / kPageTokens;
  uint64_t key = identity_;
  int32_t blocks = 0, snapshot_blocks = 0;
  uint64_t snapshot_key = 0;
  for (int32_t b = 0; b < max_blocks; ++b) {
    const auto block = tokens.subspan(static_cast<size_t>(b) * kPageTokens, kPageTokens);
    const uint64_t next = chain_key(key, block);
    auto it = nodes_.find(next);
    if (it == nodes_.end() || it->second.parent != key || !std::equal(block.begin(), block.end(), it->second.tokens.begin()))
      break;
    key = next;
    blocks = b + 1;
    if (it->second.slot >= 0) {
      snapshot_blocks = blocks;
      snapshot_key = key;
    }
  }
  if (needs_snapshots_) return {snapshot_blocks, snapshot_key};
  return {blocks, 0};
}

std::vector<PrefixCache::PathBlock> PrefixCache::path(std::span<const int32_t> tokens, int32_t limit) const {
  const int32_t max_blocks = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size())) / kPageTokens;
  std::vector<PathBlock> out;
  uint64_t key = identity_;
  for (int32_t b = 0; b < max_blocks; ++b) {
    const auto block = tokens.subspan(static_cast<size_t>(b) * kPageTokens, kPageTokens);
    const uint64_t next = chain_key(key, block);
    auto it = nodes_.find(next);
    if (it == nodes_.end() || it->second.parent != key || !std::equal(block.begin(), block.end(), it->second.tokens.begin()))
      break;
    out.push_back({next, it->second.page, it->second.slot});
    key = next;
  }
  return out;
}

int32_t PrefixCache::probe(std::span<const int32_t> tokens, int32_t limit) const {
  return walk(tokens, limit).first * kPageTokens;
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, int32_t limit) {
  ++stats_.lookups;
  Hit hit;
  hit.chain.key = identity_;
  const auto [blocks, snapshot_key] = walk(tokens, limit);
  for (int32_t b = 0; b < blocks; ++b) {
    const uint64_t next = chain_key(hit.chain.key, tokens.subspan(static_cast<size_t>(b) * kPageTokens, kPageTokens));
    Node& node = nodes_.at(next);
    pool_.retain(node.page);
    hit.pages.push_back(node.page);
    touch(next, node);
    hit.chain.key = next;
  }
  hit.chain.blocks = blocks;
  hit.tokens = blocks * kPageTokens;
  if (snapshot_key != 0) {
    Node& node = nodes_.at(snapshot_key);
    snapshot_lru_.erase({node.snapshot_tick, snapshot_key});
    node.snapshot_tick = ++clock_;
    snapshot_lru_.insert({node.snapshot_tick, snapshot_key});
    hit.snapshot_slot = node.slot;
    ++stats_.snapshot_hits;
  }
  if (hit.tokens > 0) {
    ++stats_.hits;
    stats_.reused_tokens += static_cast<uint64_t>(hit.tokens);
  }
  return hit;
}

void PrefixCache::publish(std::span<const int32_t> tokens, int32_t computed, std::vector<int32_t>& pages,
                          BlockChain& chain) {
  if (chain.blocks < 0) return;
  if (chain.blocks == 0) chain.key = identity_;
  const int32_t full = std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) / kPageTokens;
  while (chain.blocks < full && chain.blocks < static_cast<int32_t>(pages.size())) {
    const auto block = tokens.subspan(static_cast<size_t>(chain.blocks) * kPageTokens, kPageTokens);
    const uint64_t key = chain_key(chain.key, block);
    int32_t& page = pages[static_cast<size_t>(chain.blocks)];
    auto it = nodes_.find(key);
    if (it != nodes_.end()) {
      Node& node = it->second;
      if (node.parent != chain.key || !std::equal(block.begin(), block.end(), node.tokens.begin())) {
        chain.blocks = -1;  // a hash collision: this sequence publishes nothing more
        return;
      }
      if (node.page != page) {
        pool_.retain(node.page);
        pool_.release(page);
        page = node.page;
        ++stats_.blocks_duplicate;
      }
      touch(key, node);
    } else {
      if (chain.blocks > 0) {
        Node& parent = nodes_.at(chain.key);
        if (parent.children++ == 0) leaf_erase(chain.key, parent);
      }
      Node node;
      node.parent = chain.key;
      node.page = page;
      node.tokens.assign(block.begin(), block.end());
      node.tick = ++clock_;
      pool_.retain(page);
      auto [inserted, ok] = nodes_.emplace(key, std::move(node));
      (void)ok;
      leaf_insert(key, inserted->second);
      ++stats_.blocks_inserted;
    }
    chain.key = key;
    ++chain.blocks;
  }
}

void PrefixCache::touch(uint64_t key, Node& node) {
  const bool leaf = node.children == 0;
  if (leaf) leaf_erase(key, node);
  node.tick = ++clock_;
  if (leaf) leaf_insert(key, node);
}

void PrefixCache::leaf_insert(uint64_t key, const Node& node) { leaves_.insert({node.slot >= 0 ? 1 : 0, node.tick, key}); }

void PrefixCache::leaf_erase(uint64_t key, const Node& node) { leaves_.erase({node.slot >= 0 ? 1 : 0, node.tick, key}); }

bool PrefixCache::has_snapshot(uint64_t key) const {
  auto it = nodes_.find(key);
  return it != nodes_.end() && it->second.slot >= 0;
}

int PrefixCache::acquire_slot() {
  if (free_slots_.empty()) {
    if (snapshot_lru_.empty()) return -1;
    const uint64_t victim = snapshot_lru_.begin()->second;
    Node& node = nodes_.at(victim);
    if (sink_) sink_({victim, node.parent, node.tokens, -1, node.slot});
    free_snapshot(victim, node);
    ++stats_.snapshots_evicted;
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void PrefixCache::attach_snapshot(uint64_t key, int slot) {
  if (slot < 0 || slot >= total_slots_) throw std::invalid_argument("attach_snapshot: slot out of range");
  auto it = nodes_.find(key);
  if (it == nodes_.end() || it->second.slot >= 0) {
    free_slots_.push_back(slot);
    return;
  }
  Node& node = it->second;
  const bool leaf = node.children == 0;
  if (leaf) leaf_erase(key, node);
  node.slot = slot;
  node.snapshot_tick = ++clock_;
  snapshot_lru_.insert({node.snapshot_tick, key});
  if (leaf) leaf_insert(key, node);
  ++stats_.snapshots_created;
}

void PrefixCache::drop_snapshot(uint64_t key) {
  auto it = nodes_.find(key);
  if (it != nodes_.end() && it->second.slot >= 0) free_snapshot(key, it->second);
}

void PrefixCache::free_snapshot(uint64_t key, Node& node) {
  const bool leaf = node.children == 0;
  if (leaf) leaf_erase(key, node);
  snapshot_lru_.erase({node.snapshot_tick, key});
  free_slots_.push_back(node.slot);
  node.slot = -1;
  if (leaf) leaf_insert(key, node);
}

bool PrefixCache::evict_one() {
  for (auto it = leaves_.begin(); it != leaves_.end(); ++it) {
    const uint64_t key = std::get<2>(*it);
    Node& node = nodes_.at(key);
    if (pool_.refs(node.page) != 1) continue;  // a running sequence maps it
    if (sink_) sink_({key, node.parent, node.tokens, node.page, node.slot});
    if (node.slot >= 0) free_snapshot(key, node);
    leaf_erase(key, node);
    pool_.release(node.page);
    const uint64_t parent_key = node.parent;
    nodes_.erase(key);
    if (auto parent = nodes_.find(parent_key); parent != nodes_.end() && --parent->second.children == 0)
      leaf_insert(parent_key, parent->second);
    ++stats_.evicted_blocks;
    return true;
  }
  return false;
}

int64_t PrefixCache::unreferenced_blocks() const {
  int64_t n = 0;
  for (const auto& [key, node] : nodes_) n += pool_.refs(node.page) == 1 ? 1 : 0;
  return n;
}

std::vector<PrefixCache::BlockRecord> PrefixCache::export_blocks() const {
  std::unordered_map<uint64_t, std::vector<uint64_t>> children;
  for (const auto& [key, node] : nodes_) children[node.parent].push_back(key);
  std::vector<BlockRecord> out;
  std::vector<uint64_t> frontier{identity_};
  while (!frontier.empty()) {  // breadth first from the root: parents precede children
    std::vector<uint64_t> next;
    for (uint64_t parent : frontier) {
      auto it = children.find(parent);
      if (it == children.end()) continue;
      std::sort(it->second.begin(), it->second.end());  // deterministic order
      for (uint64_t key : it->second) {
        const Node& node = nodes_.at(key);
        out.push_back({key, parent, node.tokens, node.page, node.slot});
        next.push_back(key);
      }
    }
    frontier = std::move(next);
  }
  return out;
}

uint64_t PrefixCache::adopt(uint64_t parent, std::span<const int32_t> tokens, int32_t page) {
  if (tokens.size() != static_cast<size_t>(kPageTokens)) throw std::invalid_argument("adopt: a block has 64 tokens");
  const uint64_t key = chain_key(parent, tokens);
  if (nodes_.count(key) || (parent != identity_ && !nodes_.count(parent))) {
    pool_.release(page);
    return 0;
  }
  if (parent != identity_) {
    Node& up = nodes_.at(parent);
    if (up.children++ == 0) leaf_erase(parent, up);
  }
  Node node;
  node.parent = parent;
  node.page = page;
  node.tokens.assign(tokens.begin(), tokens.end());
  node.tick = ++clock_;
  auto [inserted, ok] = nodes_.emplace(key, std::move(node));
  (void)ok;
  leaf_insert(key, inserted->second);
  ++stats_.blocks_inserted;
  return key;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  s.blocks = static_cast<int64_t>(nodes_.size());
  s.unreferenced_blocks = unreferenced_blocks();
  s.snapshots = static_cast<int64_t>(snapshot_lru_.size());
  s.snapshot_slots = total_slots_;
  return s;
}

std::string PrefixCache::check() const {
  std::unordered_map<uint64_t, int32_t> children;
  std::vector<bool> slot_used(static_cast<size_t>(total_slots_), false);
  size_t leaves = 0;
  for (const auto& [key, node] : nodes_) {
    if (node.parent != identity_) {
      if (!nodes_.count(node.parent)) return "a block's parent is missing (the tree is not prefix-closed)";
      ++children[node.parent];
    }
    if (node.page < 0 || node.page >= pool_.num_pages() || pool_.refs(node.page) < 1)
      return "a block's page is not held";
    if (node.slot >= 0) {
      if (slot_used[static_cast<size_t>(node.slot)]) return "a snapshot slot is shared";
      slot_used[static_cast<size_t>(node.slot)] = true;
    }
    if (node.children == 0) {
      ++leaves;
      if (!leaves_.count({node.slot >= 0 ? 1 : 0, node.tick, key})) return "a leaf is missing from the eviction order";
    }
  }
  for (const auto& [key, node] : nodes_) {
    auto it = children.find(key);
    if ((it == children.end() ? 0 : it->second) != node.children) return "a block's child count is wrong";
  }
  if (leaves != leaves_.size()) return "the eviction order holds blocks that are not leaves";
  const size_t used = static_cast<size_t>(std::count(slot_used.begin(), slot_used.end(), true));
  if (used != snapshot_lru_.size() || used + free_slots_.size() != static_cast<size_t>(total_slots_))
    return "snapshot slots leak";
  return {};
}

}  // namespace ninfer
