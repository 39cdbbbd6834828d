#include "cache/kv_pool.h"

#include <algorithm>
#include <stdexcept>

namespace ninfer {

KvPool::KvPool(int64_t num_pages, int64_t num_layers, int64_t num_kv_heads, int64_t head_dim)
    : num_pages_(num_pages), num_layers_(num_layers), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
  if (num_pages <= 0 || num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0)
    throw std::invalid_argument("KvPool: all dimensions must be positive");
  free_list_.resize(static_cast<size_t>(num_pages));
  // Hand out low page ids first: pop from the back of a descending list.
  for (int64_t i = 0; i < num_pages; ++i) free_list_[i] = static_cast<int32_t>(num_pages - 1 - i);
}

void KvPool::attach_storage(KvStorage storage) {
  if (has_storage()) throw std::logic_error("KvPool: storage is already attached (" + storage_.device + ")");
  if (!storage.memory) throw std::invalid_argument("KvPool: attach_storage needs memory");
  storage_ = std::move(storage);
  host_f32_ = storage_.device == "cpu" && storage_.dtype == DType::F32 ? static_cast<float*>(storage_.memory.get())
                                                                        : nullptr;
}

std::optional<std::vector<int32_t>> KvPool::allocate(int64_t count) {
  if (count < 0 || count > free_pages()) return std::nullopt;
  std::vector<int32_t> pages(free_list_.end() - count, free_list_.end());
  std::reverse(pages.begin(), pages.end());
  free_list_.resize(free_list_.size() - static_cast<size_t>(count));
  return pages;
}

void KvPool::release(const std::vector<int32_t>& pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) free_list_.push_back(*it);
}

}  // namespace ninfer
