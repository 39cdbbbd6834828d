// Wall time of the engine worker, split into host phases and device wait (docs/operations.md).
//
// The worker walks a lap clock through each unit of work: every lap charges the time since
// the previous one to exactly one bucket, so the buckets never overlap and each second of the
// worker's busy time counts once, whatever the batch size. Idle time (the worker asleep on its
// condition variable) is dropped by restart(). Buckets are atomics: stats() reads them from
// any thread without stopping the worker.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ninfer {

// The mutually exclusive host phases (the spec's names, in its order).
enum class HostPhase : uint8_t {
  EngineBoundary,      // timeouts, cancellations, admissions, drafting choices, the step plan
  ProgramSubmit,       // host work that prepares a forward: sampling rows, grammar masks
  ProgramPost,         // after a forward: failure handling, token accounting, the MTP head's host side
  EngineCommitOutput,  // sampling/commit of every row, stops, publishing the outputs
  EngineMaintenance,   // retiring finished requests
};
inline constexpr size_t kHostPhases = 5;
inline constexpr std::array<const char*, kHostPhases> kHostPhaseNames = {
    "engine_boundary", "program_submit", "program_post", "engine_commit_output", "engine_maintenance"};

class WorkerTime {
 public:
  using Clock = std::chrono::steady_clock;

  // Worker only. Forgets the time since the last lap (the worker was idle).
  void restart() { last_ = Clock::now(); }
  // Worker only. The time since the last lap was host work of `phase`.
  void lap(HostPhase phase) { host_ns_[static_cast<size_t>(phase)].fetch_add(take(), std::memory_order_relaxed); }
  // Worker only. The time since the last lap was spent blocked in a backend forward (on the
  // CPU backend that is the forward's computation itself).
  // Returns the lap's nanoseconds (a caller may also charge them to a sub-account).
  uint64_t lap_device_wait() {
    const uint64_t ns = take();
    device_wait_ns_.fetch_add(ns, std::memory_order_relaxed);
    return ns;
  }

  // Any thread.
  uint64_t host_ns(HostPhase phase) const { return host_ns_[static_cast<size_t>(phase)].load(std::memory_order_relaxed); }
  uint64_t device_wait_ns() const { return device_wait_ns_.load(std::memory_order_relaxed); }

 private:
  uint64_t take() {
    const auto now = Clock::now();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    last_ = now;
    return ns > 0 ? static_cast<uint64_t>(ns) : 0;
  }

  Clock::time_point last_ = Clock::now();  // worker only
  std::array<std::atomic<uint64_t>, kHostPhases> host_ns_{};
  std::atomic<uint64_t> device_wait_ns_{0};
};

}  // namespace ninfer
