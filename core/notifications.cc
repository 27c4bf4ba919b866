#include "core/notifications.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "common/event_loop.h"
#include "common/futex.h"

namespace rdmabuf {

void NoticeTaker::wait_for_looks() const {
  while (calls_.load() != 0)
    std::this_thread::yield();  // a look is one pass over a channel, and never waits
}

void NoticeRoutes::add(uint64_t key, NoticeTaker* taker) {
  std::lock_guard lock(mu_);
  takers_[key] = taker;
}

void NoticeRoutes::remove(uint64_t key) {
  std::lock_guard lock(mu_);  // a delivery under way holds it
  takers_.erase(key);
}

Result<Notification> NoticeRoutes::notification_for(uint64_t writer, const NoticeRecord& notice) {
  std::lock_guard lock(mu_);
  auto it = takers_.find(notice.endpoint_key);
  if (it == takers_.end()) return NotFound("no endpoint here has the notice's key (closed?)");
  return it->second->notification_for(writer, notice);
}

void NoticeRoutes::look_for_notes() {
  // The endpoints, each counted as called (calls_) while mu_ is held, so
  // that one removed meanwhile waits for this look before it goes.
  thread_local std::vector<NoticeTaker*> looked;
  {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return;  // a change or a backend's notice: look next time
    looked.clear();
    for (const auto& [key, taker] : takers_) {
      taker->calls_.fetch_add(1);
      looked.push_back(taker);
    }
  }
  for (NoticeTaker* taker : looked) {
    taker->look_for_notes();
    taker->calls_.fetch_sub(1);
  }
}

void NoticeRoutes::looks_ended() {
  std::lock_guard lock(mu_);
  for (const auto& [key, taker] : takers_)
    taker->looks_ended();
}

Status NotificationQueue::try_push(const Notification& n) {
  std::unique_lock lock(mu_);
  if (closed_) return FailedPrecondition("the manager is shut down");
  if (handler_) {
    call_handler(lock, n);
    return Status::Ok();
  }
  if (queue_.size() >= kCapacity) {
    return ResourceExhausted(std::to_string(kCapacity) + " notifications wait to be taken");
  }
  enqueue(n);
  return Status::Ok();
}

bool NotificationQueue::push(const Notification& n, const std::function<bool()>& give_up) {
  std::unique_lock lock(mu_);
  while (!closed_ && !handler_ && queue_.size() >= kCapacity) {
    if (give_up()) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  if (closed_) return false;
  if (handler_) {
    call_handler(lock, n);
    return true;
  }
  enqueue(n);
  return true;
}

void NotificationQueue::enqueue(const Notification& n) {
  queue_.push_back(n);
  queued_.store(queue_.size(), std::memory_order_release);
  cv_.notify_all();
}

bool NotificationQueue::try_queue(const Notification& n) {
  std::lock_guard lock(mu_);
  if (closed_ || handler_ || queue_.size() >= kCapacity) return false;
  enqueue(n);
  return true;
}

Result<Notification> NotificationQueue::pop(std::chrono::milliseconds timeout,
                                            std::chrono::microseconds busy_poll,
                                            NoticeRoutes* routes) {
  const Deadline deadline = Clock::now() + timeout;
  BusyPoll spin(
      std::min(busy_poll, std::chrono::duration_cast<std::chrono::microseconds>(timeout)));
  bool looked = false;
  while (queued_.load(std::memory_order_acquire) == 0) {
    if (routes && busy_poll.count() > 0 && !has_handler_.load(std::memory_order_relaxed)) {
      routes->look_for_notes();
      looked = true;
      if (queued_.load(std::memory_order_acquire) != 0) break;
    }
    if (!spin.spin()) {
      // Asleep from here on: the endpoints' servers read for it again.
      if (looked) routes->looks_ended();
      break;
    }
  }
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return closed_ || !queue_.empty(); })) {
    return DeadlineExceeded("no notification came in time");
  }
  if (closed_) return FailedPrecondition("the manager is shut down");
  Notification n = std::move(queue_.front());
  queue_.pop_front();
  queued_.store(queue_.size(), std::memory_order_relaxed);
  cv_.notify_all();  // room for a waiting producer
  return n;
}

namespace {
// The queues whose handler this thread is calling now, innermost last (a
// handler may cause another notification on its own thread).
thread_local std::vector<const NotificationQueue*> handlers_calling;
}  // namespace

void NotificationQueue::call_handler(std::unique_lock<std::mutex>& lock, const Notification& n) {
  std::shared_ptr<Handler> handler = handler_;
  handlers_calling.push_back(this);  // before the count: nothing to undo if it throws
  handler->calls.fetch_add(1);
  lock.unlock();
  struct Calling {  // counts the call as ended however it ends
    Handler& handler;
    ~Calling() {
      handlers_calling.pop_back();
      // Pairs with set_handler's store of `replaced` and load of `calls`
      // (both sequentially consistent): one of the two sees the other.
      // Only the handler is touched from here (this call holds it): the
      // queue may go as soon as its set_handler sees no call.
      if (handler.calls.fetch_sub(1) == 1 && handler.replaced.load()) {
        std::lock_guard relock(handler.ended_mu);  // the waiter is asleep, or sees calls == 0
        handler.ended.notify_all();
      }
    }
  };
  {
    Calling calling{*handler};
    handler->call(n);
  }
  // `handler` goes here, without mu_: a replaced handler's captures may
  // call back in.
}

void NotificationQueue::set_handler(std::function<void(const Notification&)> handler) {
  // Not from a handler, nor on a loop's thread: a call under way on another
  // thread may wait for this one (its endpoint's close, a transfer).
  const bool may_wait =
      std::find(handlers_calling.begin(), handlers_calling.end(), this) == handlers_calling.end() &&
      !EventLoop::on_a_loop_thread();
  std::shared_ptr<Handler> replacing =
      handler ? std::make_shared<Handler>(std::move(handler)) : nullptr;
  std::shared_ptr<Handler> replaced;
  {
    std::unique_lock lock(mu_);
    replaced = std::exchange(handler_, std::move(replacing));
    has_handler_.store(handler_ != nullptr, std::memory_order_relaxed);
    cv_.notify_all();
  }
  if (replaced && may_wait) {
    replaced->replaced.store(true);
    std::unique_lock lock(replaced->ended_mu);
    replaced->ended.wait(lock, [&] { return replaced->calls.load() == 0; });
  }
  // `replaced` (what it captured) goes here, without mu_, unless a call
  // under way still holds it.
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
