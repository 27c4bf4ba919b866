// Manager-wide state the endpoints share (core/endpoint/): the queue of
// notifications of tagged writes that landed in this manager's memory, the
// endpoints that notices from the backends go to, and the budget of memory
// lent to peers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "rdmabuf/backend.h"
#include "rdmabuf/endpoint.h"
#include "rdmabuf/status.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

class NoticeRoutes;

// Notifications waiting for Manager::next_notification, or handed to the
// handler set with Manager::set_notification_handler. Thread-safe.
class NotificationQueue {
 public:
  // Queued at most; a producer then waits for room (backpressure on the
  // peer that writes, instead of a notification lost).
  static constexpr size_t kCapacity = 65536;

  // Hands `n` to the handler, or queues it. While the queue is full, waits
  // for room, checking `give_up` every 50 ms; false when it gave up or the
  // queue is closed (the notification is dropped then).
  bool push(const Notification& n, const std::function<bool()>& give_up);
  // push() that never waits: kResourceExhausted (nothing queued) while the
  // queue is full, kFailedPrecondition once closed. A handler runs on this
  // thread.
  Status try_push(const Notification& n);
  // Queues `n` when that needs no wait and no handler: false (nothing
  // queued) while a handler is set, the queue is full or closed. For a
  // waiter in pop() that found `n` itself (NoticeRoutes::look_for_notes):
  // a handler runs on an endpoint's server, never inside such a call.
  bool try_queue(const Notification& n);
  // The oldest notification. kDeadlineExceeded after `timeout`;
  // kFailedPrecondition once closed. While none is queued it looks again
  // (yielding the CPU between looks) for `busy_poll`, then sleeps. With
  // `routes`, each look reads the endpoints' channels too
  // (NoticeRoutes::look_for_notes), and a wait that sleeps hands the
  // reading back to the endpoints' servers first (looks_ended). No looks
  // while a handler is set (what they read would go to it).
  Result<Notification> pop(std::chrono::milliseconds timeout,
                           std::chrono::microseconds busy_poll = {},
                           NoticeRoutes* routes = nullptr);
  // Replaces the handler (empty: queue again). Returns once no call of
  // the handler it replaced is under way, so that what that handler uses
  // may go; except from a handler (one that replaces itself) or on a loop's
  // thread (a transfer's on_done), where it returns at once: a call under
  // way elsewhere may be waiting for this one.
  void set_handler(std::function<void(const Notification&)> handler);
  // For shutdown: pops and pushes fail from now on, waiters wake.
  void close();

 private:
  // A handler, and its calls under way.
  struct Handler {
    explicit Handler(std::function<void(const Notification&)> f) : call(std::move(f)) {}
    const std::function<void(const Notification&)> call;
    std::atomic<int> calls{0};          // under way
    std::atomic<bool> replaced{false};  // set_handler waits for calls to end
    std::mutex ended_mu;                // for `ended`
    std::condition_variable ended;      // calls became 0 after `replaced`
  };

  // Appends `n` and wakes the waiters (mu_ held).
  void enqueue(const Notification& n);
  // Calls the handler with `n` without mu_ (it may call back into the
  // manager), counted in its calls; `lock` holds mu_ before, and not after.
  // The last reference to a handler replaced meanwhile goes without mu_.
  void call_handler(std::unique_lock<std::mutex>& lock, const Notification& n);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Notification> queue_;
  std::atomic<size_t> queued_{0};         // queue_.size(), for a waiter that spins
  std::shared_ptr<Handler> handler_;      // null: none; calls under way keep theirs
  std::atomic<bool> has_handler_{false};  // handler_ is set: a waiter does not look
  bool closed_ = false;
};

// What NoticeRoutes asks about a notice: an endpoint
// (core/endpoint/notification_delivery.cc).
class NoticeTaker {
 public:
  // The notification `notice` (its buffer, token and range checked by the
  // manager) stands for, as this endpoint would have delivered it from a
  // frame; kPermissionDenied when `writer` is not this endpoint's peer.
  // Never blocks.
  virtual Result<Notification> notification_for(uint64_t writer, const NoticeRecord& notice) = 0;
  // For a waiter in Manager::next_notification that spins: reads what the
  // endpoint's channel holds, when no other thread reads it, and queues the
  // notifications found (NotificationQueue::try_queue), so that they reach
  // the waiter with no hand-over between threads. One look, no wait; what
  // it cannot do, the endpoint's server does as before.
  virtual void look_for_notes() = 0;
  // The waiter stopped looking to sleep: the endpoint's server reads
  // again from now on, woken by the peer's writes. (A waiter that got what
  // it waited for says nothing: it is likely back soon, and if not, the
  // endpoint's server reads again once no look has read for a while,
  // within about 16 ms: docs/threads.md.) Never blocks.
  virtual void looks_ended() = 0;

 protected:
  virtual ~NoticeTaker() = default;
  // Returns once no look (NoticeRoutes::look_for_notes) at this taker is
  // under way; after NoticeRoutes::remove, none starts. For its owner's
  // close. A look never waits, so this is microseconds.
  void wait_for_looks() const;

 private:
  friend class NoticeRoutes;
  std::atomic<int> calls_{0};  // NoticeRoutes' calls under way without its lock
};

// This manager's endpoints by their notice keys (WriteNotice::endpoint_key),
// for the notices the backends read (NoticeSink). Thread-safe.
class NoticeRoutes {
 public:
  void add(uint64_t key, NoticeTaker* taker);
  // Returns once no delivery to `key` is under way; none starts after.
  void remove(uint64_t key);
  // The notification `notice` stands for (NoticeTaker::notification_for);
  // kNotFound when no endpoint has `notice.endpoint_key` (closed, or never
  // was).
  Result<Notification> notification_for(uint64_t writer, const NoticeRecord& notice);
  // NoticeTaker::look_for_notes on every endpoint, for a waiter that spins
  // (Manager::next_notification); nothing while another thread adds or
  // removes one. The looks run without this class's lock, so that they
  // hold up no backend's notice; a closing endpoint waits for a look under
  // way (wait_for_looks).
  void look_for_notes();
  // NoticeTaker::looks_ended on every endpoint: the waiter is done
  // looking. Waits for mu_.
  void looks_ended();

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, NoticeTaker*> takers_;
};

// Bytes lent to peers at once, against Config::lend_limit.
class LendBudget {
 public:
  explicit LendBudget(uint64_t limit) : limit_(limit) {}
  // Takes `bytes` from the budget; false (nothing taken) when they do not fit.
  bool take(uint64_t bytes);
  void give_back(uint64_t bytes) { used_.fetch_sub(bytes); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace rdmabuf
