// A fixed set of single-threaded event loops that drive many tasks: each
// task is pinned to one loop, and every call into it runs on that loop's
// thread, one at a time, so a task's state needs no lock. Other threads
// reach a task only through kick(). The number of threads does not grow
// with the number of tasks (a reader's tcp streams to hundreds of owners
// share them).
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

class EventLoop;

// Work pinned to one loop. The loop holds a reference while the task is
// kicked, watches a descriptor for it, or keeps a timer for it.
class LoopTask {
 public:
  virtual ~LoopTask() = default;
  // On the loop's thread: after a kick, when a watched descriptor is ready,
  // or once the time given to wake_at() has come. May find nothing to do.
  virtual void on_run(EventLoop& loop) = 0;
};

class EventLoop {
 public:
  // The loop's thread starts at once. After activity it keeps polling for
  // `busy_poll` (yielding the CPU between polls) before it sleeps.
  static Result<std::unique_ptr<EventLoop>> create(std::chrono::microseconds busy_poll);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Any thread: runs the task's on_run soon, on the loop's thread. After
  // stop(), runs it once more as the loop ends; false, and never runs it,
  // once the loop has ended.
  bool kick(std::shared_ptr<LoopTask> task);

  // The loop's thread only (from on_run). Watches `fd` for `events`
  // (EPOLLIN, EPOLLOUT; level-triggered) on behalf of `task`. Fails only
  // when the kernel refuses the watch (out of memory).
  Status watch(const std::shared_ptr<LoopTask>& task, int fd, uint32_t events);
  // Stops watching `fd` (if it is); must come before the descriptor closes.
  void unwatch(int fd);
  // Runs the task at `at` unless it runs before; every run cancels the
  // time, so a task that still wants one sets it again. Deadline::max():
  // no time.
  void wake_at(const std::shared_ptr<LoopTask>& task, Deadline at);
  // 64 KiB the running task may use until it returns (contents not kept).
  std::span<uint8_t> scratch() { return {scratch_.get(), kScratchBytes}; }
  // Whether the calling thread is this loop's.
  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Whether the calling thread is any loop's (a task's run, or a callback
  // from one): it must not wait for another loop's work.
  static bool on_a_loop_thread();
  // Whether a task was kicked since the loop last ran the kicked ones: a
  // task that spins a while (polling memory a device writes) yields the
  // loop when this turns true. Any thread.
  bool has_kicks() const { return has_kicks_.load(std::memory_order_relaxed); }
  // The loop's thread only: the descriptor whose readiness runs the
  // current task, or -1 when a kick or its time runs it.
  int ready_fd() const { return ready_fd_; }
  // The loop's thread only (from on_run): this run did nothing that more
  // may follow soon (a timed look that found nothing), so it does not
  // start the loop's busy-poll window.
  void quiet() { quiet_ = true; }

  // Returns once every task kicked before the call has run (its final run,
  // for a task that was just told to stop). From the loop's own thread, or
  // once the loop has ended, returns at once.
  void drain();

  // Runs what was kicked before, joins the thread; later kicks are
  // dropped. The loop's thread lets go of every task as it ends, without
  // a run for those that only watch or wait for a time. On the loop's own
  // thread it only asks the loop to end after the current run (the
  // destructor joins it).
  void stop();

 private:
  static constexpr size_t kScratchBytes = 64 << 10;
  struct Watch {
    std::shared_ptr<LoopTask> task;
    uint32_t events = 0;
  };

  EventLoop(Fd epoll, Fd wake, std::chrono::microseconds busy_poll);
  void run();
  // Runs `task` once, first cancelling its time; false when it said the
  // run was quiet().
  bool run_task(const std::shared_ptr<LoopTask>& task);
  // Runs the tasks kicked so far; true when any run was not quiet.
  bool run_kicked();
  // Runs the tasks whose time has come; true when any run was not quiet.
  bool run_timers();
  int sleep_ms() const;

  Fd epoll_;
  Fd wake_;  // eventfd: kicks wake the loop through it while it sleeps
  const std::chrono::microseconds busy_poll_;
  std::unique_ptr<uint8_t[]> scratch_{new uint8_t[kScratchBytes]};
  std::thread thread_;

  // Guards kicked_ and stopping_ against kick() from other threads.
  std::mutex mu_;
  std::vector<std::shared_ptr<LoopTask>> kicked_;
  bool stopping_ = false;
  bool ended_ = false;                  // the thread has left its loop
  std::atomic<bool> has_kicks_{false};  // kicked_ is not empty (read without mu_)
  std::atomic<bool> sleeping_{false};   // in epoll_wait with a timeout other than 0

  // The loop's thread's own state.
  int ready_fd_ = -1;
  bool quiet_ = false;  // the running task called quiet()
  std::unordered_map<int, Watch> watched_;
  std::set<std::pair<Deadline, LoopTask*>> timers_;
  std::unordered_map<LoopTask*, std::pair<Deadline, std::shared_ptr<LoopTask>>> timer_of_;
};

// A fixed set of loops; each new task goes to the next in turn.
class EventLoops {
 public:
  static Result<std::unique_ptr<EventLoops>> create(int threads,
                                                    std::chrono::microseconds busy_poll);
  EventLoop& next();
  int threads() const { return static_cast<int>(loops_.size()); }
  // EventLoop::drain on each.
  void drain();
  // Stops every loop (EventLoop::stop).
  void stop();

 private:
  std::vector<std::unique_ptr<EventLoop>> loops_;
  std::atomic<size_t> turn_{0};
};

// The event loops that one manager's backends share for their outbound
// connections (tcp streams, ibverbs queue pairs), and its endpoints'
// servers wait on: made on first use, so a manager that only owns buffers
// runs none. A backend that stops drains
// them (its tasks' final runs have run); the manager stops them once
// every backend has. Thread-safe.
class SharedLoops {
 public:
  SharedLoops(int threads, std::chrono::microseconds busy_poll)
      : threads_(threads), busy_poll_(busy_poll) {}
  ~SharedLoops() { stop(); }
  SharedLoops(const SharedLoops&) = delete;
  SharedLoops& operator=(const SharedLoops&) = delete;

  // The loops, started on the first call; kCancelled once stopped.
  Result<EventLoops*> get();
  // Threads started (0 before the first get()).
  int threads() const;
  // EventLoops::drain, if they were started.
  void drain();
  void stop();

 private:
  const int threads_;
  const std::chrono::microseconds busy_poll_;
  mutable std::mutex mu_;  // guards loops_ and stopped_
  std::unique_ptr<EventLoops> loops_;
  bool stopped_ = false;
};

}  // namespace rdmabuf
