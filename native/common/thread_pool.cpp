#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

namespace ninfer {

namespace {

thread_local bool t_inside_job = false;

constexpr auto kSpin = std::chrono::microseconds(40);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `ready` for up to kSpin; true when it became true.
template <typename Ready>
bool spin_until(const Ready& ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  int total = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  total = std::max(total, 1);
  workers_.reserve(static_cast<size_t>(total - 1));
  for (int i = 1; i < total; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true);
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
    const auto published = [&] {
      return stopping_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(published)) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, published);
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_items();
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);  // pairs with the caller's predicate check under mutex_
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1 || t_inside_job) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard caller(call_mutex_);  // one job at a time when several threads share the pool
  job_ = &fn;
  job_items_ = n;
  next_item_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_items();
  const auto finished = [&] { return busy_workers_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished)) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, finished);
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
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
