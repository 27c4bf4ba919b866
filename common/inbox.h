// Work handed to one thread that starts on demand and exits when idle: the
// shape of a per-link I/O thread in rdmabuf (an ibverbs queue pair; tcp
// streams run on event loops instead, common/event_loop.h).
//
// Submitters push items from any thread; the first push after the thread
// exited starts it again. The thread takes items, sleeps on wake_fd() when
// it has nothing to do (after prepare_sleep() said it may), and leaves once
// try_exit() agrees that nothing new came. stop() ends it for good.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/socket.h"

namespace rdmabuf {

template <typename T>
class Inbox {
 public:
  // `body` is the thread: it returns after try_exit() returned true, or
  // once stop_requested().
  explicit Inbox(std::function<void()> body) : body_(std::move(body)) {
    auto fd = make_eventfd();
    if (fd.ok()) wake_fd_ = std::move(fd).value();
  }
  ~Inbox() { stop(); }
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Moves `items` in and wakes or starts the thread. After stop(), leaves
  // them in `items` and returns false: the caller fails them.
  bool push(std::vector<T>& items) {
    std::unique_lock lock(mu_);
    if (stopped_) return false;
    for (T& item : items)
      items_.push_back(std::move(item));
    items.clear();
    has_items_.store(true, std::memory_order_seq_cst);
    if (!running_) {
      if (thread_.joinable()) thread_.join();  // it has returned; reap it
      running_ = true;
      thread_ = std::thread(body_);
      return true;
    }
    lock.unlock();
    if (sleeping_.load(std::memory_order_seq_cst)) signal_eventfd(wake_fd_.get());
    return true;
  }

  // The thread: appends what was pushed to `out`; true when anything was.
  bool take(std::deque<T>& out) {
    if (!has_items_.load(std::memory_order_acquire)) return false;
    std::vector<T> taken;
    {
      std::lock_guard lock(mu_);
      taken.swap(items_);
      has_items_.store(false, std::memory_order_relaxed);
    }
    for (T& item : taken)
      out.push_back(std::move(item));
    return !taken.empty();
  }

  // The thread: true when nothing is waiting, and then the thread counts as
  // gone (the next push starts a new one): return at once.
  bool try_exit() {
    std::lock_guard lock(mu_);
    if (!items_.empty()) return false;
    running_ = false;
    return true;
  }

  // The thread, around a sleep that watches wake_fd(): false when items
  // arrived meanwhile (do not sleep then; call after_sleep() anyway).
  bool prepare_sleep() {
    sleeping_.store(true, std::memory_order_seq_cst);
    return !has_items_.load(std::memory_order_seq_cst);
  }
  void after_sleep(bool woken_by_fd) {
    sleeping_.store(false, std::memory_order_relaxed);
    if (woken_by_fd) drain_eventfd(wake_fd_.get());
  }
  int wake_fd() const { return wake_fd_.get(); }

  bool stop_requested() const { return stop_requested_.load(std::memory_order_acquire); }

  // True when no thread runs and nothing waits.
  bool idle() {
    std::lock_guard lock(mu_);
    return !running_ && items_.empty();
  }

  // Ends the thread for good (it sees stop_requested()) and joins it;
  // returns the items it never took. Idempotent.
  std::vector<T> stop() {
    std::thread joining;
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
      stop_requested_.store(true, std::memory_order_release);
      joining = std::move(thread_);
    }
    if (joining.joinable()) {
      signal_eventfd(wake_fd_.get());
      joining.join();
    }
    std::lock_guard lock(mu_);
    std::vector<T> left;
    left.swap(items_);
    return left;
  }

  // The thread, on its way out after stop_requested(): whatever is left.
  std::vector<T> take_all() {
    std::lock_guard lock(mu_);
    std::vector<T> left;
    left.swap(items_);
    running_ = false;
    return left;
  }

 private:
  std::function<void()> body_;
  std::mutex mu_;
  std::vector<T> items_;
  bool running_ = false;
  bool stopped_ = false;
  std::thread thread_;
  std::atomic<bool> has_items_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_requested_{false};
  Fd wake_fd_;
};

}  // namespace rdmabuf
