#include "common/thread_pool.h"

#include <algorithm>

namespace ninfer {

namespace {
thread_local bool t_inside_job = false;
}

ThreadPool::ThreadPool(int threads) {
  int total = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  total = std::max(total, 1);
  workers_.reserve(static_cast<size_t>(total - 1));
  for (int i = 1; i < total; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_items() {
  const bool was_inside = t_inside_job;
  t_inside_job = true;
  for (;;) {
    const int64_t i = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (i >= job_items_) break;
    try {
      (*job_)(i);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_item_.store(job_items_, std::memory_order_relaxed);  // skip what is left
    }
  }
  t_inside_job = was_inside;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_items();
    {
      std::lock_guard lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1 || t_inside_job) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_items_ = n;
    next_item_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    busy_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_items();
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return busy_workers_ == 0; });
    job_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::parallel_ranges(int64_t n, int64_t grain,
                                 const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // A few ranges per thread lets the dynamic counter even out stragglers.
  const int64_t target = static_cast<int64_t>(size()) * 4;
  const int64_t chunk = std::max(grain, (n + target - 1) / target);
  const int64_t ranges = (n + chunk - 1) / chunk;
  parallel_for(ranges, [&](int64_t r) { fn(r * chunk, std::min(n, (r + 1) * chunk)); });
}

}  // namespace ninfer
