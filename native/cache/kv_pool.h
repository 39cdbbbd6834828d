// Paged KV storage shared by all lanes: fixed 64-token pages allocated from a free list.
//
// Pages are reference counted: a running sequence holds one reference to every page of its
// page table and the prefix cache holds one to every page its block tree keeps, so a cached
// block can be mapped into several sequences at once. A page returns to the free list when
// its last reference goes.
//
// Layout of page p for layer l: one region per (layer, page, K or V) of region_bytes() bytes
// at byte region_offset(l, p, which). With --kv-dtype bf16 a region is
// [kPageTokens][num_kv_heads][head_dim] elements of the storage's dtype (K at element
// page_offset(l, p, 0), V at page_offset(l, p, 1)); a quantized pool's region holds codes and
// scales as cache/kv_format.h lays out (KvRegion).
// A lane's page table lists page ids in position order; token t lives in page
// table[t / kPageTokens], row t % kPageTokens.
//
// The pool does the page bookkeeping; the memory itself belongs to the backend that runs the
// model (host float32 for the CPU backend, device bf16 for the CUDA backend), which attaches
// it through Backend::bind_kv before the first KV write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/kv_format.h"
#include "common/dtype.h"

namespace ninfer {

inline constexpr int kPageTokens = 64;

// Memory holding every page of every layer; `device` names where it lives ("cpu", "cuda:0").
struct KvStorage {
  std::shared_ptr<void> memory;
  DType dtype = DType::F32;
  std::string device = "cpu";
};

class KvPool {
 public:
  KvPool(int64_t num_pages, int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
         KvDType kv_dtype = KvDType::BF16);

  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t capacity_tokens() const { return num_pages_ * kPageTokens; }
  // The stored format; bf16 keeps the backend's own float type (`element_bytes` below).
  KvDType kv_dtype() const { return kv_dtype_; }
  bool quantized() const { return kv_dtype_ != KvDType::BF16; }
  // The parts of a quantized region (throws for bf16).
  KvRegion region() const { return KvRegion::of(kv_dtype_, kPageTokens, num_kv_heads_, head_dim_); }
  // Bytes of one (layer, page, K|V) region; `element_bytes` is the storage's element size and
  // only counts for bf16 pools.
  int64_t region_bytes(int64_t element_bytes) const {
    return quantized() ? region().bytes : page_elems() * element_bytes;
  }
  // Bytes one page takes (all layers, K and V): what the sizer, the host tier and the prefix
  // cache file count.
  int64_t page_bytes(int64_t element_bytes) const { return num_layers_ * 2 * region_bytes(element_bytes); }
  // Byte offset of region (layer, page, K|V) in the storage.
  int64_t region_offset(int64_t layer, int64_t page, int which, int64_t element_bytes) const {
    return ((layer * num_pages_ + page) * 2 + which) * region_bytes(element_bytes);
  }
  int64_t storage_bytes(int64_t element_bytes) const { return num_pages_ * page_bytes(element_bytes); }
  // Changes the page count; only before storage is attached and while no page is taken
  // (startup sizing from the memory left after the weights). Throws otherwise.
  void resize(int64_t num_pages);
  // A sizing rule the backend applies when it attaches storage: given the bytes it could
  // still use and the bytes of one page, the page count (for --kv-capacity auto).
  using Sizer = std::function<int64_t(int64_t available_bytes, int64_t page_bytes)>;
  void set_sizer(Sizer sizer) { sizer_ = std::move(sizer); }
  // Applies the sizer, if any, once (backends call it in bind_kv before allocating).
  void resolve_size(int64_t available_bytes, int64_t element_bytes);
  int64_t num_layers() const { return num_layers_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t page_elems() const { return kPageTokens * num_kv_heads_ * head_dim_; }
  // Elements of the whole storage (all layers, K and V).
  int64_t storage_elems() const { return num_pages_ * num_layers_ * 2 * page_elems(); }

  // Takes `count` pages (one reference each), or none when fewer are free.
  std::optional<std::vector<int32_t>> allocate(int64_t count);
  // Adds a reference to a taken page.
  void retain(int32_t page);
  // Drops one reference from each page; a page without references becomes free.
  void release(const std::vector<int32_t>& pages);
  void release(int32_t page);
  int32_t refs(int32_t page) const { return refs_.at(static_cast<size_t>(page)); }

  // --- storage ---------------------------------------------------------------------------
  bool has_storage() const { return storage_.memory != nullptr; }
  const KvStorage& storage() const { return storage_; }
  // Attaches the page memory (storage_elems() elements of storage.dtype); once only.
  void attach_storage(KvStorage storage);
  // Element offset of layer `layer`, page `page`, K (which = 0) or V (which = 1).
  int64_t page_offset(int64_t layer, int64_t page, int which) const {
    return ((layer * num_pages_ + page) * 2 + which) * page_elems();
  }

  // Host float32 storage of a bf16 pool only (the CPU backend's).
  float* key_page(int64_t layer, int32_t page) { return host_f32_ + page_offset(layer, page, 0); }
  float* value_page(int64_t layer, int32_t page) { return host_f32_ + page_offset(layer, page, 1); }

 private:
  int64_t num_pages_, num_layers_, num_kv_heads_, head_dim_;
  KvDType kv_dtype_;
  KvStorage storage_;
  float* host_f32_ = nullptr;  // storage_.memory when it is host float32
  std::vector<int32_t> free_list_;
  std::vector<int32_t> refs_;  // references per page; 0 = on the free list
  Sizer sizer_;
};

}  // namespace ninfer
