#include "core/notifications.h"

namespace rdmabuf {

void NoticeRoutes::add(uint64_t key, NoticeTaker* taker) {
  std::lock_guard lock(mu_);
  takers_[key] = taker;
}

void NoticeRoutes::remove(uint64_t key) {
  std::lock_guard lock(mu_);  // a delivery under way holds it
  takers_.erase(key);
}

Status NoticeRoutes::deliver(uint64_t writer, const NoticeRecord& notice) {
  std::lock_guard lock(mu_);
  auto it = takers_.find(notice.endpoint_key);
  if (it == takers_.end()) return NotFound("no endpoint here has the notice's key (closed?)");
  return it->second->take_notice(writer, notice);
}

bool NotificationQueue::push(const Notification& n, const std::function<bool()>& give_up) {
  std::unique_lock lock(mu_);
  while (!closed_ && !handler_ && queue_.size() >= kCapacity) {
    if (give_up()) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  if (closed_) return false;
  if (handler_) {
    auto handler = handler_;  // runs unlocked: it may call back into the manager
    lock.unlock();
    handler(n);
    return true;
  }
  queue_.push_back(n);
  cv_.notify_all();
  return true;
}

Result<Notification> NotificationQueue::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const Deadline deadline = Clock::now() + timeout;
  if (!cv_.wait_until(lock, deadline, [&] { return closed_ || !queue_.empty(); })) {
    return DeadlineExceeded("no notification came in time");
  }
  if (closed_) return FailedPrecondition("the manager is shut down");
  Notification n = std::move(queue_.front());
  queue_.pop_front();
  cv_.notify_all();  // room for a waiting producer
  return n;
}

void NotificationQueue::set_handler(std::function<void(const Notification&)> handler) {
  std::lock_guard lock(mu_);
  handler_ = std::move(handler);
  cv_.notify_all();
}

void NotificationQueue::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

bool LendBudget::take(uint64_t bytes) {
  uint64_t used = used_.load();
  do {
    if (bytes > limit_ || used > limit_ - bytes) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes));
  return true;
}

}  // namespace rdmabuf
