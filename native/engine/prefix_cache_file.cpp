// The prefix cache file: the device block cache and its state snapshots across a restart.
//
// Layout (host byte order, the file never leaves the machine that wrote it):
//   header  "NINFPC02", root key (model identity), build stamp, page bytes, snapshot floats,
//           record count, KV format (KvDType, --kv-dtype) and 7 bytes of padding
//   records parent record index (-1: a first block), 64 token ids, snapshot flag, the page's
//           bytes (every layer, K then V, each region as the pool stores it: elements of its
//           storage type for bf16, codes and scales for a quantized --kv-dtype), the snapshot's floats
//           when flagged, and an FNV-1a checksum of the record
//   trailer "NINFPCND", record count
// Records come parents first, so any prefix of them is prefix-closed. A load checks the whole
// file before it changes anything.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <unordered_map>
#include <unistd.h>

#include "engine/engine.h"

namespace ninfer {

namespace {

constexpr char kMagic[8] = {'N', 'I', 'N', 'F', 'P', 'C', '0', '2'};  // 02: the KV format is recorded
constexpr char kTrailer[8] = {'N', 'I', 'N', 'F', 'P', 'C', 'N', 'D'};

// Files from another build are ignored: the KV layout or numerics may differ.
uint64_t build_stamp() {
  const char* stamp = __DATE__ " " __TIME__;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char* p = stamp; *p; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 0x100000001b3ULL;
  return h;
}

struct Checksum {
  uint64_t h = 0xcbf29ce484222325ULL;
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  }
};

struct Header {
  char magic[8];
  uint64_t root, build, page_bytes, snapshot_floats, records;
  uint8_t kv_dtype;
  uint8_t pad[7];
};

struct RecordHead {
  int64_t parent;
  int32_t tokens[kPageTokens];
  uint8_t has_snapshot;
};

// One record read from `in` into the buffers; false on a short read or a bad checksum.
bool read_record(std::istream& in, RecordHead& head, std::vector<std::byte>& page, std::vector<float>& state,
                 int64_t snapshot_floats) {
  Checksum sum;
  if (!in.read(reinterpret_cast<char*>(&head), sizeof head)) return false;
  sum.add(&head, sizeof head);
  if (!in.read(reinterpret_cast<char*>(page.data()), static_cast<std::streamsize>(page.size()))) return false;
  sum.add(page.data(), page.size());
  if (head.has_snapshot) {
    state.resize(static_cast<size_t>(snapshot_floats));
    if (!in.read(reinterpret_cast<char*>(state.data()), static_cast<std::streamsize>(state.size() * sizeof(float))))
      return false;
    sum.add(state.data(), state.size() * sizeof(float));
  }
  uint64_t stored = 0;
  if (!in.read(reinterpret_cast<char*>(&stored), sizeof stored)) return false;
  return stored == sum.h;
}

}  // namespace

std::vector<Engine::SavedBlock> Engine::saved_blocks() const {
  // The device tree and the host tier together, parents first from the root.
  std::unordered_map<uint64_t, SavedBlock> all;
  for (const auto& b : cache_->export_blocks()) all[b.key] = {b.key, b.parent, b.tokens, b.page, b.slot};
  if (host_) {
    for (const auto& r : host_->records()) {
      auto [it, created] = all.try_emplace(r.key);
      SavedBlock& b = it->second;
      if (created) {
        if (!r.page) {  // a snapshot of a block no longer anywhere
          all.erase(it);
          continue;
        }
        b = {r.key, r.parent, r.tokens, -1, -1};
        b.host_page = r.page;
      }
      if (b.slot < 0) b.host_snapshot = r.snapshot;
    }
  }
  std::unordered_map<uint64_t, std::vector<uint64_t>> below;
  for (const auto& [key, b] : all) below[b.parent].push_back(key);
  std::vector<SavedBlock> out;
  std::vector<uint64_t> frontier{cache_->root_key()};
  while (!frontier.empty()) {
    std::vector<uint64_t> next;
    for (uint64_t parent : frontier) {
      auto it = below.find(parent);
      if (it == below.end()) continue;
      std::sort(it->second.begin(), it->second.end());
      for (uint64_t key : it->second) {
        out.push_back(all.at(key));
        next.push_back(key);
      }
    }
    frontier = std::move(next);
  }
  return out;
}

CacheFileReport Engine::save_prefix_cache(const std::string& path) {
  CacheFileReport report;
  if (!cache_) {
    report.message = "prefix reuse is off: nothing to save";
    return report;
  }
  if (worker_.joinable()) {
    report.message = "the engine is still running; save after shutdown";
    return report;
  }
  const auto blocks = saved_blocks();
  const int64_t page_bytes = pool_->page_bytes(row_bytes(pool_->storage().dtype, 1));
  const int64_t state_floats = model_->has_recurrent_state() ? model_->snapshot_floats() : 0;
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    report.message = "cannot write " + tmp + ": " + std::strerror(errno);
    return report;
  }
  bool good = true;
  auto put = [&](const void* data, size_t n) {
    good = good && std::fwrite(data, 1, n, f) == n;
    report.bytes += static_cast<int64_t>(n);
  };
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.root = cache_->root_key();
  header.build = build_stamp();
  header.page_bytes = static_cast<uint64_t>(page_bytes);
  header.snapshot_floats = static_cast<uint64_t>(state_floats);
  header.records = blocks.size();
  header.kv_dtype = static_cast<uint8_t>(pool_->kv_dtype());
  put(&header, sizeof header);
  std::unordered_map<uint64_t, int64_t> index{{cache_->root_key(), -1}};
  std::vector<std::byte> page(static_cast<size_t>(page_bytes));
  std::vector<float> state(static_cast<size_t>(state_floats));
  for (size_t i = 0; i < blocks.size() && good; ++i) {
    const auto& b = blocks[i];
    RecordHead head{};
    head.parent = index.at(b.parent);
    std::copy(b.tokens.begin(), b.tokens.end(), head.tokens);
    head.has_snapshot = (b.slot >= 0 || b.host_snapshot) && state_floats > 0 ? 1 : 0;
    index[b.key] = static_cast<int64_t>(i);
    if (b.page >= 0) model_->kv_page_io(b.page, page.data(), true);
    else std::memcpy(page.data(), b.host_page, page.size());
    Checksum sum;
    sum.add(&head, sizeof head);
    sum.add(page.data(), page.size());
    put(&head, sizeof head);
    put(page.data(), page.size());
    if (head.has_snapshot) {
      if (b.slot >= 0) model_->snapshot_io(b.slot, state.data(), true);
      else std::memcpy(state.data(), b.host_snapshot, state.size() * sizeof(float));
      sum.add(state.data(), state.size() * sizeof(float));
      put(state.data(), state.size() * sizeof(float));
      ++report.snapshots;
    }
    put(&sum.h, sizeof sum.h);
    ++report.blocks;
  }
  put(kTrailer, sizeof kTrailer);
  const uint64_t count = blocks.size();
  put(&count, sizeof count);
  good = good && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  good = std::fclose(f) == 0 && good;
  std::error_code error;
  if (good) std::filesystem::rename(tmp, path, error);
  if (!good || error) {
    std::filesystem::remove(tmp, error);
    report.message = "writing " + path + " failed; the previous file is kept";
    return report;
  }
  report.ok = true;
  report.message = "saved " + std::to_string(report.blocks) + " blocks and " + std::to_string(report.snapshots) +
                   " snapshots (" + std::to_string(report.bytes >> 20) + " MiB) to " + path;
  return report;
}

CacheFileReport Engine::load_prefix_cache(const std::string& path) {
  CacheFileReport report;
  if (!cache_) {
    report.message = "prefix reuse is off: the file is not read";
    return report;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    report.message = "no prefix cache file at " + path + " yet";
    return report;
  }
  Header header{};
  const int64_t page_bytes = pool_->page_bytes(row_bytes(pool_->storage().dtype, 1));
  const int64_t state_floats = model_->has_recurrent_state() ? model_->snapshot_floats() : 0;
  if (!in.read(reinterpret_cast<char*>(&header), sizeof header) || std::memcmp(header.magic, kMagic, 8) != 0) {
    report.message = path + " is not a prefix cache file of this format: ignored";
    return report;
  }
  if (header.kv_dtype != static_cast<uint8_t>(pool_->kv_dtype())) {
    const auto stored = header.kv_dtype <= static_cast<uint8_t>(KvDType::NVFP4)
                            ? std::string(kv_dtype_name(static_cast<KvDType>(header.kv_dtype)))
                            : "an unknown format";
    report.message = path + " holds KV pages in --kv-dtype " + stored + ", but this server stores " +
                     std::string(kv_dtype_name(pool_->kv_dtype())) + ": ignored (the next save replaces it)";
    return report;
  }
  if (header.root != cache_->root_key() || header.build != build_stamp() ||
      header.page_bytes != static_cast<uint64_t>(page_bytes) ||
      header.snapshot_floats != static_cast<uint64_t>(state_floats)) {
    report.message = path + " was written for another model, KV format or build: ignored (the next save replaces it)";
    return report;
  }
  // First pass: every record and the trailer must be intact before anything is restored.
  RecordHead head{};
  std::vector<std::byte> page(static_cast<size_t>(page_bytes));
  std::vector<float> state;
  const std::streampos body = in.tellg();
  for (uint64_t i = 0; i < header.records; ++i) {
    if (!read_record(in, head, page, state, state_floats) || head.parent >= static_cast<int64_t>(i)) {
      report.message = path + " is damaged (record " + std::to_string(i) + "): ignored";
      return report;
    }
  }
  char trailer[8] = {};
  uint64_t count = 0;
  if (!in.read(trailer, 8) || std::memcmp(trailer, kTrailer, 8) != 0 || !in.read(reinterpret_cast<char*>(&count), 8) ||
      count != header.records) {
    report.message = path + " is truncated: ignored";
    return report;
  }
  in.clear();
  in.seekg(body);
  std::lock_guard lock(mu_);
  std::vector<uint64_t> keys;
  keys.reserve(static_cast<size_t>(header.records));
  bool full = false;
  int64_t on_host = 0;
  std::unordered_map<uint64_t, bool> hosted;  // restored blocks that went to the host tier
  for (uint64_t i = 0; i < header.records; ++i) {
    read_record(in, head, page, state, state_floats);
    const uint64_t parent = head.parent < 0 ? cache_->root_key() : keys[static_cast<size_t>(head.parent)];
    const std::span<const int32_t> tokens(head.tokens, kPageTokens);
    uint64_t key = 0;
    bool host_block = false;
    // The device first (an empty pool at startup), then the host tier; a block whose parent
    // went to the host stays there too, so the device tree keeps its prefix closure.
    if (parent != 0 && !full && !hosted.count(parent)) {
      auto taken = pool_->allocate(1);
      if (!taken) {
        full = true;
      } else {
        model_->kv_page_io(taken->front(), page.data(), false);
        key = cache_->adopt(parent, tokens, taken->front());
      }
    }
    if (parent != 0 && key == 0 && host_ && (full || hosted.count(parent))) {
      bool fresh = false;
      const uint64_t at = cache_->chain_key(parent, tokens);
      if (std::byte* image = host_->store_block(at, parent, tokens, &fresh); image && fresh) {
        std::memcpy(image, page.data(), page.size());
        key = at;
        host_block = true;
        hosted[at] = true;
        ++on_host;
      }
    }
    keys.push_back(key);
    if (key == 0) continue;
    ++report.blocks;
    report.bytes += page_bytes;
    if (!head.has_snapshot) continue;
    const int64_t state_bytes = state_floats * static_cast<int64_t>(sizeof(float));
    if (!host_block && cache_->has_free_slot()) {
      const int slot = cache_->acquire_slot();
      model_->snapshot_io(slot, state.data(), false);
      cache_->attach_snapshot(key, slot);
    } else if (host_) {
      bool fresh = false;
      float* image = host_->store_snapshot(key, parent, tokens, &fresh);
      if (!image || !fresh) continue;
      std::memcpy(image, state.data(), static_cast<size_t>(state_bytes));
    } else {
      continue;
    }
    ++report.snapshots;
    report.bytes += state_bytes;
  }
  full = report.blocks < static_cast<int64_t>(header.records);
  report.ok = true;
  report.message = "restored " + std::to_string(report.blocks) + " of " + std::to_string(header.records) +
                   " blocks and " + std::to_string(report.snapshots) + " snapshots from " + path;
  if (on_host > 0) report.message += " (" + std::to_string(on_host) + " blocks into the host tier)";
  if (full)
    report.message += host_ ? " (the device pool and host tier are smaller than the file needs: the rest was left out)"
                            : " (the KV pool is smaller than the file needs: the rest was left out)";
  return report;
}

}  // namespace ninfer
