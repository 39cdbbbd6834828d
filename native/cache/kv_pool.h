// Paged KV storage shared by all lanes: fixed 64-token pages allocated from a free list.
//
// Layout of page p for layer l (float32 on the CPU backend):
//   K: [kPageTokens][num_kv_heads][head_dim] at key_page(l, p)
//   V: same shape at value_page(l, p)
// A lane's page table lists page ids in position order; token t lives in page
// table[t / kPageTokens], row t % kPageTokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace ninfer {

inline constexpr int kPageTokens = 64;

class KvPool {
 public:
  KvPool(int64_t num_pages, int64_t num_layers, int64_t num_kv_heads, int64_t head_dim);

  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t num_layers() const { return num_layers_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t page_elems() const { return kPageTokens * num_kv_heads_ * head_dim_; }

  // Takes `count` pages, or none when fewer are free.
  std::optional<std::vector<int32_t>> allocate(int64_t count);
  void release(const std::vector<int32_t>& pages);

  float* key_page(int64_t layer, int32_t page) { return page_ptr(layer, page, 0); }
  float* value_page(int64_t layer, int32_t page) { return page_ptr(layer, page, 1); }

 private:
  float* page_ptr(int64_t layer, int32_t page, int which) {
    return storage_.data() + ((layer * num_pages_ + page) * 2 + which) * page_elems();
  }

  int64_t num_pages_, num_layers_, num_kv_heads_, head_dim_;
  std::vector<float> storage_;
  std::vector<int32_t> free_list_;
};

}  // namespace ninfer
