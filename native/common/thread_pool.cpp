#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace ninfer {

namespace {

thread_local bool t_inside_job = false;

constexpr auto kSpin = std::chrono::microseconds(40);
constexpr int64_t kMaxItems = 0x7fffffff;  // the item index lives in the ticket's low 32 bits

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

// A ticket whose item is kClosed names a job still being set up: nothing can be claimed.
constexpr uint64_t kClosed = 0xffffffffu;

constexpr uint64_t job_of(uint64_t ticket) { return ticket >> 32; }
constexpr int64_t item_of(uint64_t ticket) { return static_cast<int64_t>(ticket & 0xffffffffu); }
constexpr bool is_open(uint64_t ticket) { return (ticket & 0xffffffffu) != kClosed; }

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

void ThreadPool::run_items(uint64_t job) {
  // Read after seeing `job` open. Should the job already be over, these may belong to a later
  // one, but the caller closed the ticket under that later job's number before writing them,
  // so every claim below fails.
  const std::function<void(int64_t)>* fn = job_fn_.load(std::memory_order_acquire);
  const int64_t n = job_items_.load(std::memory_order_acquire);
  const bool was_inside = t_inside_job;
  t_inside_job = true;
  uint64_t ticket = ticket_.load(std::memory_order_acquire);
  while (job_of(ticket) == job && item_of(ticket) < n) {
    if (!ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire))
      continue;  // another thread took this item (or a new job began): `ticket` is refreshed
    const int64_t i = item_of(ticket);
    if (!failed_.load(std::memory_order_relaxed)) {  // after a failure the rest is skipped
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);
      }
    }
    if (done_items_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      std::lock_guard lock(mutex_);  // pairs with the caller's predicate check under mutex_
      done_.notify_one();
    }
    ticket = ticket_.load(std::memory_order_acquire);
  }
  t_inside_job = was_inside;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    const auto published = [&] {
      if (stopping_.load(std::memory_order_acquire)) return true;
      const uint64_t ticket = ticket_.load(std::memory_order_acquire);
      return job_of(ticket) != seen && is_open(ticket);
    };
    if (!spin_until(published)) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, published);
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    const uint64_t ticket = ticket_.load(std::memory_order_acquire);
    if (!is_open(ticket)) continue;  // the next job is being set up: wait for it to open
    seen = job_of(ticket);
    run_items(seen);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1 || t_inside_job) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (n > kMaxItems) throw std::invalid_argument("ThreadPool::parallel_for: too many items");
  std::lock_guard caller(call_mutex_);  // one job at a time when several threads share the pool
  // The job is over once all its items are done, whichever threads ran them: a worker that
  // was descheduled and never joined does not hold the caller up. The ticket is closed under
  // the new number first, so a late worker of the previous job that reads the new fields can
  // no longer claim anything with them.
  const uint64_t job = job_of(ticket_.load(std::memory_order_relaxed)) + 1;
  ticket_.store(job << 32 | kClosed, std::memory_order_seq_cst);
  job_fn_.store(&fn, std::memory_order_release);
  job_items_.store(n, std::memory_order_release);
  done_items_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  {
    std::lock_guard lock(mutex_);
    ticket_.store(job << 32, std::memory_order_release);
  }
  wake_.notify_all();
  run_items(job);
  const auto finished = [&] { return done_items_.load(std::memory_order_acquire) == n; };
  if (!spin_until(finished)) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, finished);
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
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
