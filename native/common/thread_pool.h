// A persistent pool of worker threads for data-parallel kernels.
//
// The calling thread takes part in every job, so a pool of size 1 runs everything inline.
// Work items are handed out dynamically from a shared counter, which balances uneven items
// (attention over sequences of different lengths) without a per-job plan. Jobs do not nest:
// a parallel_for issued from inside a job runs inline on the calling worker.
// Decode issues a few hundred short jobs per token, so idle workers and the waiting caller
// spin briefly before sleeping: a futex wake-up per job would cost more than the job.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ninfer {

class ThreadPool {
 public:
  // threads = 0 uses every hardware thread; the count includes the calling thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) once for every i in [0, n) and returns when all calls are done. The first
  // exception thrown by any call is rethrown here after the job drains.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

  // Splits [0, n) into contiguous ranges of at least `grain` items (about a few per thread)
  // and calls fn(begin, end) for each.
  void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_items();

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};  // bumped (under mutex_) to publish each job
  std::atomic<bool> stopping_{false};
  std::atomic<int> busy_workers_{0};     // workers still inside the current job

  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t job_items_ = 0;
  std::atomic<int64_t> next_item_{0};
  std::exception_ptr error_;      // first failure of the current job, under mutex_
};

}  // namespace ninfer
