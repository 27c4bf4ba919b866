// Notifications of the peer's tagged writes into this manager's memory: from
// kNotify frames (or a backend's notices, NoticeTaker::notification_for) to
// the manager's queue (NotificationQueue), in order. The endpoint's server
// delivers them; a waiter in Manager::next_notification that spins may read
// the channel itself (look_for_notes) and hand over what it found, with no
// hand-over between threads.
#include "common/strings.h"
#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {

// A notice from a backend (NoticeSink), its buffer, token and range checked
// by the manager: the notification a kNotify frame would give.
Result<Notification> EndpointImpl::notification_for(uint64_t writer, const NoticeRecord& notice) {
  if (writer != peer_manager_id_) {
    return PermissionDenied("a notice for the endpoint to " + peer_ + " came from manager " +
                            hex_id(writer) + ", not its peer");
  }
  return Notification{notice.tag, notice.buffer_id, notice.offset, notice.length, peer_};
}

// A kNotify frame (reader role held): queued for the endpoint's server to
// deliver, unless a waiter that looks reads it (it hands it over itself:
// look_for_notes).
Status EndpointImpl::take_notice(const endpoint::Notice& notice) {
  Notification n{notice.tag, notice.buffer_id, notice.offset, notice.length, peer_};
  bool first;
  {
    StateLock lock(mu_);
    first = notes_.empty();
    notes_.push_back(std::move(n));
  }
  if (first && !looking_) signal_eventfd(wake_.get());
  return Status::Ok();
}

// NoticeTaker::look_for_notes: one look at the channel, as the reader role's
// holder, when the role is free and frames (or, on a stream channel, maybe
// bytes) came; then the notifications read go to the manager's queue from
// this thread. Never waits: not for mu_ nor the role, and it writes nothing
// (a write may wait for room in the channel for seconds, and a waiter's
// timeout is its caller's): the replies to the frames it read, sends that
// can move on and credits that are due are left to the endpoint's server,
// woken (to read again, for the replies: they go with the next reader's
// pump). Reading counts as a caller's lead: the endpoint's server then
// leaves the channel to this thread's looks (led_lately) until
// looks_ended().
void EndpointImpl::look_for_notes() {
  {
    StateLock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || role_.held(lock) || notes_.size() >= endpoint::kMaxPendingNotes ||
        !broken_.ok()) {
      return;
    }
    // Nothing came: no reader, so a look of ours tells.
    if (notes_.empty() && channel_.frames_in_place() && !channel_.has_incoming()) return;
    const ReaderRole::Held role = role_.take(lock);
    looking_ = true;
    bool progressed = false;
    Status st = pump_holding_replies(role, progressed, lock, Take::kAll);
    if (!lock.owns_lock()) lock.lock();
    looking_ = false;
    if (progressed) {
      looked_.store(true, std::memory_order_relaxed);
      role_.count_lead(lock);
    }
    const bool replies = !reading_.held_replies.empty();
    const bool for_the_thread =
        replies || send_work_ready(lock) || (credits_.any_held_now() && credits_.due());
    release_role(lock);  // and wakes the callers behind, as a lead does
    lock.unlock();
    if (!st.ok()) {
      fail_reading(st);  // and the endpoint's server, woken, delivers what was read
      return;
    }
    if (for_the_thread) {
      if (replies) reader_wanted_.store(true);
      signal_eventfd(wake_.get());
    }
  }
  hand_over_notes();
}

// NoticeTaker::looks_ended: the endpoint's server reads again, woken now,
// when a waiter's looks kept it away. Never blocks.
void EndpointImpl::looks_ended() {
  if (!looked_.exchange(false, std::memory_order_relaxed)) return;
  reader_wanted_.store(true);
  signal_eventfd(wake_.get());
}

// A looking waiter's (look_for_notes): hands notes_ to the manager's queue
// in order, without waiting; what it cannot hand over (a handler is set,
// the queue is full, the endpoint's server is delivering), the server
// delivers, woken.
void EndpointImpl::hand_over_notes() {
  std::unique_lock delivering(deliver_mu_, std::try_to_lock);
  if (!delivering.owns_lock()) {
    signal_eventfd(wake_.get());  // it may have looked at notes_ before ours came
    return;
  }
  while (true) {
    Notification n;
    {
      StateLock lock(mu_);
      if (notes_.empty()) return;
      n = notes_.front();
    }
    if (!host_.notifications().try_queue(n)) {
      signal_eventfd(wake_.get());
      return;
    }
    StateLock lock(mu_);
    notes_.take_front();
    wake_sleepers(lock);  // reading may go on, if notes_ had filled
  }
}

// Hands the queued notifications to the manager, oldest first; waits while
// its queue is full. False when the endpoint is closing.
bool EndpointImpl::deliver_notes() {
  std::lock_guard delivering(deliver_mu_);
  while (true) {
    Notification n;
    {
      StateLock lock(mu_);
      if (notes_.empty()) return true;
      n = notes_.take_front();
    }
    cv_.notify_all();  // reading may go on, if it had stopped
    if (!host_.notifications().push(n, [this] { return stopping(); })) return false;
  }
}

}  // namespace rdmabuf
