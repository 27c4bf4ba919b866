// Frames out of an endpoint: one writer at a time (the frames lock), the
// credits held back in front of each write, replies held back while their
// writer dispatches, and a writer blocked on a full channel reading what
// the peer sent meanwhile.
#include <poll.h>

#include <optional>
#include <thread>

#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {
namespace {

// A peer that does not read its control frames for this long is dropped.
constexpr auto kFrameWriteLimit = std::chrono::seconds(10);
// A writer waiting for the frames lock of a channel whose writes may wait
// looks at what it may read meanwhile: between two looks it yields
// kLockSpins times, then sleeps kLockLook. (Not a timed mutex:
// ThreadSanitizer does not see its timed lock, and reports its unlock.)
constexpr int kLockSpins = 64;
constexpr auto kLockLook = std::chrono::microseconds(200);

// The endpoint whose blocking frames lock this thread holds, writing.
thread_local const EndpointImpl* t_writing_blocked = nullptr;

}  // namespace

// Writes `pieces` (whole frames, together), after the credits held back.
// Written by the dispatch of a frame (a reply), they are held, and written
// once the pump is done (see pump()).
Status EndpointImpl::write_pieces(std::span<const std::span<const uint8_t>> pieces) {
  if (role_.pumping_here()) {
    for (const auto& piece : pieces)
      reading_.held_replies.insert(reading_.held_replies.end(), piece.begin(), piece.end());
    return Status::Ok();
  }
  Status st = channel_.writes_may_wait() ? write_blocking(pieces) : write_whole(pieces);
  if (st.ok()) return st;
  return broke_while_sending(st);
}

// A frame cut short (by `st`) leaves the stream unusable: closes it for
// both sides. The endpoint's state after (no lock held).
Status EndpointImpl::broke_while_sending(const Status& st) {
  break_with(Unavailable("the endpoint broke while sending: " + st.message()));
  return usable();
}

// A channel whose writes may wait (TCP): the credits held back, then
// `pieces`, in one gathered send, under write_mu_ throughout. While the
// channel has no room, or another writer holds write_mu_, this thread reads
// when it may, as a writer waiting for room in a ring does: the reader
// role's holder writing the replies it held must not stop reading while a
// writer waits for room.
Status EndpointImpl::write_blocking(std::span<const std::span<const uint8_t>> pieces) {
  for (int tries = 0; !write_mu_.try_lock(); ++tries) {
    read_while_blocked();
    if (tries < kLockSpins) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kLockLook);
    }
  }
  std::lock_guard lock(write_mu_, std::adopt_lock);
  std::vector<iovec>& gathered = socket_pieces_;
  gathered.clear();
  const std::span<const uint8_t> held = credits_.held();
  gathered.push_back({const_cast<uint8_t*>(held.data()), held.size()});
  for (const auto& piece : pieces)
    gathered.push_back({const_cast<uint8_t*>(piece.data()), piece.size()});
  t_writing_blocked = this;
  Status st = channel_.write(gathered, Clock::now() + kFrameWriteLimit, stop_.get(),
                             [this] { read_while_blocked(); });
  t_writing_blocked = nullptr;
  credits_.sent();
  return st;
}

// A channel whose writes never wait: the credits held back, then `pieces`,
// whole or not at all, under mu_ (its frames lock); then a doorbell when
// the peer's reader asked for one. While the channel has no room for them,
// this thread waits without the lock, and reads meanwhile when it may
// (wait_for_room): the peer may be waiting for room in the other direction.
Status EndpointImpl::write_whole(std::span<const std::span<const uint8_t>> pieces) {
  Deadline deadline = Deadline::min();  // read the clock only when the channel is full
  Deadline spin_until;
  while (true) {
    bool doorbell = false;
    Result<bool> wrote = [&] {
      StateLock lock(mu_);
      return try_write(lock, pieces, doorbell);
    }();
    RDMABUF_RETURN_IF_ERROR(wrote.status());
    if (*wrote) {
      if (doorbell) channel_.ring_doorbell();
      return Status::Ok();
    }
    if (deadline == Deadline::min()) {
      const Deadline now = Clock::now();
      deadline = now + kFrameWriteLimit;
      spin_until = now + busy_poll_;
    }
    RDMABUF_RETURN_IF_ERROR(wait_for_room(spin_until, deadline));
  }
}

// The outgoing channel is full: the peer reads slower than this side writes.
// Reads the incoming one meanwhile when this thread may, then waits a
// little: without sleeping until `spin_until` (Config::busy_poll after the
// channel first had no room: a reader that keeps up empties it in tens of
// microseconds, and a millisecond's sleep would leave it idle for the
// rest), then a millisecond at a time. Fails when the peer has gone, the
// endpoint closes, or `deadline` passed.
Status EndpointImpl::wait_for_room(Deadline spin_until, Deadline deadline) {
  const Deadline now = Clock::now();
  if (now >= deadline) {
    return DeadlineExceeded("the peer stopped reading the endpoint's frames");
  }
  read_while_blocked();
  pollfd watched[2] = {{fd_.get(), POLLRDHUP, 0}, {stop_.get(), POLLIN, 0}};
  ::poll(watched, 2, now < spin_until ? 0 : 1);
  if (watched[1].revents != 0) return Cancelled("the endpoint was closed");
  if ((watched[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
    return Unavailable("connection closed by peer");
  }
  return Status::Ok();
}

// A writer blocked on a full channel reads what the peer sent, so that two
// sides that both write more than their channel holds do not wait on each
// other for ever: when this thread holds the reader role (and is not inside
// pump(), whose frame is not taken yet) or the role is free. The dispatch
// of a frame never writes (its replies are held: write_pieces), so reading
// needs no lock a writer holds. Replies written after a pump may themselves
// wait and read; a few levels deep, they only wait.
void EndpointImpl::read_while_blocked() {
  constexpr int kMostNested = 4;
  std::optional<ReaderRole::Held> role;
  bool took = false;
  {
    StateLock lock(mu_);
    if (role_.held(lock)) {
      if (!role_.held_by_this_thread(lock) || role_.holder_is_pumping(lock) ||
          reading_.reply_depth >= kMostNested) {
        return;
      }
      role = role_.confirm(lock);  // a wait of this thread's writes: it holds the role
    } else {
      role = role_.take(lock);
      took = true;
    }
  }
  bool progressed = false;
  Status st = pump(*role, progressed);
  if (progressed) cv_.notify_all();
  // Replies held back inside a blocking write: the endpoint's server takes
  // the role next and writes them.
  const bool replies_wait = took && !reading_.held_replies.empty();
  if (took) give_back_role();
  if (replies_wait) signal_eventfd(wake_.get());
  if (!st.ok()) fail_reading(st);
}

// Holds a receive's credit (its kPosted frame) back, to go out with the
// next frame written, or by flush(): a wait on this endpoint (as
// credits_go_when_idle and Credits::due say), or the endpoint's server
// (see server_look; at once when it sleeps: the caller wakes it). One write then
// carries, say, a receive's credit and the message that follows it, or
// several credits. Frames lock held. True at kMostHeldBack bytes: the
// caller flushes them at once.
bool EndpointImpl::hold_credit(uint64_t seq, uint64_t capacity, std::span<const uint8_t> handle) {
  return credits_.hold(seq, capacity, handle);
}

// Writes the frames held back, if any.
Status EndpointImpl::flush() {
  if (!credits_.any_held()) return Status::Ok();
  return write_pieces({});
}

bool EndpointImpl::writing_blocked_here() const {
  return t_writing_blocked == this;
}

}  // namespace rdmabuf
