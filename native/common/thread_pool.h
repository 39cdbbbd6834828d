// A persistent pool of worker threads for data-parallel kernels.
//
// The calling thread takes part in every job, so a pool of size 1 runs everything inline.
// Work items are handed out dynamically from a shared counter, which balances uneven items
// (attention over sequences of different lengths) without a per-job plan. Jobs do not nest:
// a parallel_for issued from inside a job runs inline on the calling worker.
// Decode issues a few hundred short jobs per token, so idle workers and the waiting caller
// spin briefly before sleeping: a futex wake-up per job would cost more than the job.
// A job ends when its items are done, not when every worker has checked in: on a loaded
// machine a descheduled worker would otherwise stall each job for a scheduler time slice.
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
  void run_items(uint64_t job);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<bool> stopping_{false};

  // The current job: its number in the high 32 bits and the next unclaimed item in the low
  // 32, so a claim (compare-exchange) can never take an item of a job other than the one read.
  std::atomic<uint64_t> ticket_{0};
  std::atomic<const std::function<void(int64_t)>*> job_fn_{nullptr};
  std::atomic<int64_t> job_items_{0};
  std::atomic<int64_t> done_items_{0};  // items of the current job that have finished
  std::atomic<bool> failed_{false};     // an item threw: the rest are skipped
  std::exception_ptr error_;            // first failure of the current job, under mutex_
};

}  // namespace ninfer
