// Thread-safe hand-off of engine events to the caller, with a pollable wake-up descriptor.
//
// The worker pushes; the caller watches fd() for readability (e.g. asyncio's add_reader) and
// then drains. An eventfd on Linux, a non-blocking pipe elsewhere.
#pragma once

#include <deque>
#include <mutex>
#include <vector>

#include "engine/engine_event.h"

namespace ninfer {

class EventQueue {
 public:
  EventQueue();
  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  int fd() const { return read_fd_; }
  void push(std::vector<EngineEvent>&& events);
  void push(EngineEvent&& event);
  // Everything pushed so far, oldest first; clears the descriptor's readiness.
  std::vector<EngineEvent> drain();
  size_t size() const;

 private:
  void signal();
  void clear_signal();

  mutable std::mutex mu_;
  std::vector<EngineEvent> events_;
  int read_fd_ = -1;
  int write_fd_ = -1;  // same as read_fd_ for an eventfd
};

}  // namespace ninfer
