// What other threads hand a task pinned to an event loop (common/event_loop.h):
// items pushed from any thread and taken by the task on its loop, a kick
// for the task on the first push since it last took them, and a stop
// after which pushes are refused. It also tells whether the task holds
// anything (idle()), so that its owner can forget it.
#pragma once

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "common/event_loop.h"

namespace rdmabuf {

template <typename T>
class LoopInbox {
 public:
  // Any thread: moves `items` in, and kicks `task` (a LoopTask that is
  // enable_shared_from_this) on `loop` unless a kick is pending. False,
  // with `items` left in place for the caller to fail, once stopped.
  template <typename Task>
  bool push(std::vector<T>& items, EventLoop& loop, Task* task) {
    std::lock_guard lock(mu_);
    if (stopped_) return false;
    for (T& item : items)
      items_.push_back(std::move(item));
    items.clear();
    kick_locked(loop, task);
    return true;
  }

  // Any thread: refuses pushes from now on and kicks the task, whose next
  // take() says it stopped. What was pushed and not taken comes back, for
  // the caller to fail (nothing, when it had stopped before).
  template <typename Task>
  std::vector<T> stop(EventLoop& loop, Task* task) {
    std::lock_guard lock(mu_);
    if (stopped_) return {};
    stopped_ = true;
    kick_locked(loop, task);
    return std::exchange(items_, {});
  }

  bool stopped() {
    std::lock_guard lock(mu_);
    return stopped_;
  }

  // Any thread: kicks the task (unless a kick is pending), unless stopped;
  // whether it did. The kick happens under the lock that stop() takes, so
  // a loop that is stopped only after the task is cannot be gone by then.
  template <typename Task>
  bool kick_unless_stopped(EventLoop& loop, Task* task) {
    std::lock_guard lock(mu_);
    if (stopped_) return false;
    kick_locked(loop, task);
    return true;
  }

  // The task, on its loop: appends what was pushed to `out`; true once
  // stopped. From a take that finds items until set_busy(false), idle()
  // says no, so it is never true of a task whose work the loop has taken.
  template <typename Out>
  bool take(Out& out) {
    std::lock_guard lock(mu_);
    if (!items_.empty()) busy_.store(true, std::memory_order_release);
    scheduled_ = false;
    for (T& item : items_)
      out.push_back(std::move(item));
    items_.clear();
    return stopped_;
  }

  // The task, on its loop: whether it holds work or a connection.
  void set_busy(bool busy) { busy_.store(busy, std::memory_order_release); }

  // Any thread: nothing waits to be taken, no kick is pending, and the
  // task said it holds nothing.
  bool idle() {
    std::lock_guard lock(mu_);
    return items_.empty() && !scheduled_ && !busy_.load(std::memory_order_acquire);
  }

 private:
  template <typename Task>
  void kick_locked(EventLoop& loop, Task* task) {
    if (scheduled_) return;
    scheduled_ = true;
    loop.kick(task->shared_from_this());
  }

  std::mutex mu_;  // guards all but busy_
  std::vector<T> items_;
  bool scheduled_ = false;  // kicked, and not yet taken since
  bool stopped_ = false;
  std::atomic<bool> busy_{false};
};

}  // namespace rdmabuf
