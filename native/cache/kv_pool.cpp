#include "cache/kv_pool.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

namespace ninfer {

KvPool::KvPool(int64_t num_pages, int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, KvDType kv_dtype)
    : num_pages_(0), num_layers_(num_layers), num_kv_heads_(num_kv_heads), head_dim_(head_dim), kv_dtype_(kv_dtype) {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0)
    throw std::invalid_argument("KvPool: all dimensions must be positive");
  if (kv_dtype != KvDType::BF16 && head_dim % kKvGroup != 0)
    throw std::invalid_argument("KvPool: --kv-dtype " + std::string(kv_dtype_name(kv_dtype)) +
                                " needs head_dim divisible by 16, got " + std::to_string(head_dim));
  resize(num_pages);
}

void KvPool::resize(int64_t num_pages) {
  if (num_pages <= 0) throw std::invalid_argument("KvPool: the page count must be positive");
  if (num_pages > INT32_MAX) throw std::invalid_argument("KvPool: too many pages");
  if (has_storage()) throw std::logic_error("KvPool: cannot resize once storage is attached");
  if (free_pages() != num_pages_) throw std::logic_error("KvPool: cannot resize while pages are taken");
  num_pages_ = num_pages;
  free_list_.resize(static_cast<size_t>(num_pages));
  // Hand out low page ids first: pop from the back of a descending list.
  for (int64_t i = 0; i < num_pages; ++i) free_list_[i] = static_cast<int32_t>(num_pages - 1 - i);
  refs_.assign(static_cast<size_t>(num_pages), 0);
}

void KvPool::resolve_size(int64_t available_bytes, int64_t element_bytes) {
  if (!sizer_ || has_storage()) return;
  const Sizer sizer = std::move(sizer_);
  sizer_ = nullptr;
  resize(sizer(available_bytes, page_bytes(element_bytes)));
}

void KvPool::attach_storage(KvStorage storage) {
  if (has_storage()) throw std::logic_error("KvPool: storage is already attached (" + storage_.device + ")");
  if (!storage.memory) throw std::invalid_argument("KvPool: attach_storage needs memory");
  storage_ = std::move(storage);
  host_f32_ = storage_.device == "cpu" && storage_.dtype == DType::F32 && !quantized()
                  ? static_cast<float*>(storage_.memory.get())
                  : nullptr;
}

std::optional<std::vector<int32_t>> KvPool::allocate(int64_t count) {
  if (count < 0 || count > free_pages()) return std::nullopt;
  std::vector<int32_t> pages(free_list_.end() - count, free_list_.end());
  std::reverse(pages.begin(), pages.end());
  free_list_.resize(free_list_.size() - static_cast<size_t>(count));
  for (int32_t p : pages) refs_[static_cast<size_t>(p)] = 1;
  return pages;
}

void KvPool::retain(int32_t page) {
  if (page < 0 || page >= num_pages_ || refs_[static_cast<size_t>(page)] <= 0)
    throw std::logic_error("KvPool: retain of page " + std::to_string(page) + ", which is not taken");
  ++refs_[static_cast<size_t>(page)];
}

void KvPool::release(int32_t page) {
  if (page < 0 || page >= num_pages_ || refs_[static_cast<size_t>(page)] <= 0)
    throw std::logic_error("KvPool: release of page " + std::to_string(page) + ", which is not taken");
  if (--refs_[static_cast<size_t>(page)] == 0) free_list_.push_back(page);
}

void KvPool::release(const std::vector<int32_t>& pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) release(*it);
}

}  // namespace ninfer
