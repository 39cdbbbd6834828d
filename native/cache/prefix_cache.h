// The device prefix cache: content-addressed 64-token KV blocks and recurrent-state snapshots.
//
// A block's key is a hash chain: key_i = H(key_{i-1}, tokens[64i, 64i + 64)), with key_{-1}
// the model identity, so equal keys mean equal token prefixes (each node also keeps its 64
// tokens and its parent's key, and a lookup compares them, so a hash collision is a miss,
// never a wrong hit). Nodes form a tree by parent key; the map gives O(1) per chain step.
//
// Ownership (KvPool reference counts): the tree holds one reference to every node's page and
// each sequence one to every page of its page table. A node whose page only the tree holds
// is unreferenced; eviction removes unreferenced leaves, so the tree stays prefix-closed.
// Leaves are evicted in this order: first those without a snapshot (on a hybrid model a
// block past the deepest snapshot cannot be resumed from), then least recently used.
//
// Snapshots: on a model with recurrent state a hit needs the state after exactly the hit
// position, so reuse stops at the deepest block whose end has a snapshot. The model holds the
// snapshot memory in `slots` slots; the cache only assigns them to nodes and evicts them by
// recency when a new snapshot needs a slot. Evicting a block drops its snapshot.
//
// Not thread-safe: the engine's worker (under the engine lock) makes every call.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cache/kv_pool.h"

namespace ninfer {

struct PrefixCacheStats {
  int64_t blocks = 0;             // blocks in the tree (gauge)
  int64_t unreferenced_blocks = 0;  // of those, blocks no sequence maps (gauge, evictable)
  int64_t snapshots = 0;          // snapshots held (gauge)
  int64_t snapshot_slots = 0;
  uint64_t lookups = 0, hits = 0, reused_tokens = 0;
  uint64_t snapshot_hits = 0;     // hits that resumed from a snapshot
  uint64_t blocks_inserted = 0;   // new tree blocks
  uint64_t blocks_duplicate = 0;  // committed blocks the tree already held: the sequence's page was released
  uint64_t evicted_blocks = 0;
  uint64_t snapshots_created = 0, snapshots_evicted = 0;
  uint64_t taps_created = 0, taps_skipped = 0, endpoints_created = 0;  // counted by the engine
};

// Where a sequence stands in the tree: how many of its leading blocks are published and the
// key of the last one. blocks < 0: publishing stopped (a collision), nothing more is added.
struct BlockChain {
  int32_t blocks = 0;
  uint64_t key = 0;
};

class PrefixCache {
 public:
  // `identity` names the model and KV format (the root of every chain); `slots` is the number
  // of state snapshot slots the model holds (0 for a model without recurrent state).
  PrefixCache(KvPool& pool, uint64_t identity, int slots, bool needs_snapshots);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool needs_snapshots() const { return needs_snapshots_; }
  uint64_t root_key() const { return identity_; }

  struct Hit {
    int32_t tokens = 0;           // reused prefix length (a multiple of kPageTokens)
    std::vector<int32_t> pages;   // its pages, one reference each owned by the caller
    int snapshot_slot = -1;       // the state after `tokens` (models with recurrent state)
    BlockChain chain;             // the caller's chain after the hit
  };
  // The longest reusable prefix of tokens[0, limit). Refreshes the consumed blocks and
  // snapshot. An empty hit when nothing is reusable.
  Hit lookup(std::span<const int32_t> tokens, int32_t limit);
  // How many tokens lookup would reuse; changes nothing.
  int32_t probe(std::span<const int32_t> tokens, int32_t limit) const;

  // Publishes the full blocks of tokens[0, computed) that `chain` does not cover yet; `pages`
  // is the sequence's page table. A block the tree already holds replaces the sequence's page
  // with the tree's (the sequence's reference moves to it).
  void publish(std::span<const int32_t> tokens, int32_t computed, std::vector<int32_t>& pages, BlockChain& chain);

  bool contains(uint64_t key) const { return nodes_.count(key) != 0; }
  // Snapshots, keyed by the block whose end they are the state at.
  bool has_snapshot(uint64_t key) const;
  bool has_free_slot() const { return !free_slots_.empty(); }
  // A free slot, evicting the least recently used snapshot when none is; -1 without slots.
  int acquire_slot();
  // Gives the slot to block `key`'s snapshot (the caller has filled it). The slot returns to
  // the free list when the block is unknown or already has one.
  void attach_snapshot(uint64_t key, int slot);
  void drop_snapshot(uint64_t key);

  // Evicts one unreferenced block; false when none can go.
  bool evict_one();
  // Blocks eviction could free now (unreferenced ones: their subtrees are unreferenced too).
  int64_t unreferenced_blocks() const;

  // The prefix cache file. Every block, parents before children: its key, its parent's key
  // (root_key() for a first block), tokens, page and snapshot slot (-1: none).
  struct BlockRecord {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;
    int32_t page = -1;
    int slot = -1;
  };
  std::vector<BlockRecord> export_blocks() const;
  // Adds a block under `parent` (root_key() or a known block) whose page the caller filled;
  // the tree takes over the caller's one reference to it. Returns the block's key, or 0 when
  // the parent is unknown or the block exists already (the page is then released).
  uint64_t adopt(uint64_t parent, std::span<const int32_t> tokens, int32_t page);

  // The chain key of `block` after the block keyed `parent` (root_key() for a first block).
  uint64_t chain_key(uint64_t parent, std::span<const int32_t> block) const;
  // The present blocks of tokens[0, limit) from the root, whether or not a snapshot ends them.
  struct PathBlock {
    uint64_t key = 0;
    int32_t page = -1;
    int slot = -1;
  };
  std::vector<PathBlock> path(std::span<const int32_t> tokens, int32_t limit) const;

  // Shown what eviction removes, before its page or slot is reused: a block (page >= 0, its
  // snapshot slot or -1) or only a snapshot (page < 0, the block stays). The host tier copies
  // from here.
  struct Evicted {
    uint64_t key = 0, parent = 0;
    std::span<const int32_t> tokens;
    int32_t page = -1;
    int slot = -1;
  };
  void set_eviction_sink(std::function<void(const Evicted&)> sink) { sink_ = std::move(sink); }

  PrefixCacheStats stats() const;
  // The engine's snapshot outcomes (a tap or decode endpoint taken, or skipped for lack of a slot).
  void count_snapshot(bool endpoint, bool created) {
    if (!created) ++stats_.taps_skipped;
    else if (endpoint) ++stats_.endpoints_created;
    else ++stats_.taps_created;
  }
  // "" when the tree is consistent (prefix-closed, child counts, page references, slots).
  std::string check() const;

 private:
  struct Node {
    uint64_t parent = 0;
    int32_t page = -1;
    int32_t children = 0;
    int slot = -1;
    uint64_t tick = 0, snapshot_tick = 0;
    std::vector<int32_t> tokens;
  };
  using LeafKey = std::tuple<int, uint64_t, uint64_t>;  // (has snapshot, tick, key)

  // The deepest reusable prefix: (blocks, snapshot node key or 0).
  std::pair<int32_t, uint64_t> walk(std::span<const int32_t> tokens, int32_t limit) const;
  void touch(uint64_t key, Node& node);
  void leaf_insert(uint64_t key, const Node& node);
  void leaf_erase(uint64_t key, const Node& node);
  void free_snapshot(uint64_t key, Node& node);

  KvPool& pool_;
  const uint64_t identity_;
  const bool needs_snapshots_;
  std::unordered_map<uint64_t, Node> nodes_;
  std::set<LeafKey> leaves_;                            // eviction order of leaf blocks
  std::set<std::pair<uint64_t, uint64_t>> snapshot_lru_;  // (snapshot tick, key)
  std::vector<int> free_slots_;
  int total_slots_ = 0;
  uint64_t clock_ = 0;
  PrefixCacheStats stats_;
  std::function<void(const Evicted&)> sink_;
};

}  // namespace ninfer
