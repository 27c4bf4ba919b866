#include "core/deadline_watcher.h"

namespace rdmabuf {

void DeadlineWatcher::watch(const std::shared_ptr<TransferState>& transfer) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  pending_.emplace(Key{transfer->deadline(), transfer.get()}, transfer);
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  if (transfer->deadline() < wakes_at_) {
    wakes_at_ = transfer->deadline();
    changed_.notify_one();
  }
}

void DeadlineWatcher::forget(const TransferState* transfer) {
  std::lock_guard lock(mu_);
  pending_.erase(Key{transfer->deadline(), transfer});
}

void DeadlineWatcher::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    pending_.clear();
  }
  changed_.notify_one();
  // From a callback on the watcher's own thread (an on_done that shuts its
  // manager down), the destructor joins it instead.
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void DeadlineWatcher::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (pending_.empty()) {
      wakes_at_ = Deadline::max();
      changed_.wait(lock);
      continue;
    }
    auto first = pending_.begin();
    // A copy: forget() may erase the entry while we wait without the lock.
    const Deadline next = first->first.first;
    if (Clock::now() < next) {
      wakes_at_ = next;
      changed_.wait_until(lock, next);
      continue;
    }
    std::weak_ptr<TransferState> due = std::move(first->second);
    pending_.erase(first);
    lock.unlock();
    // Outside the lock: cancelling runs the completion, which calls forget().
    if (auto transfer = due.lock()) transfer->enforce_deadline();
    lock.lock();
  }
}

}  // namespace rdmabuf
