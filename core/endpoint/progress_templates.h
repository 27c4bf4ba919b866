// The waits of an endpoint's callers (EndpointImpl::await and what it
// calls), as templates over what each waits for: included by
// endpoint_impl.h. docs/endpoints.md tells how waits read ("progress:
// whoever waits reads"); progress.cc has the rest of it.
#pragma once

#include <thread>

namespace rdmabuf {

// Waits (lock held) until `ready`, reading frames meanwhile; false at the
// deadline. Spins for Config::busy_poll before it sleeps. The clock is read
// only while waiting, never between what it waited for coming and the
// return (a read costs about 40 ns here: as much as the rest of taking a
// small message).
template <typename Pred>
bool EndpointImpl::await(StateLock& lock, WaitDeadline& deadline, Pred ready) {
  Deadline spin_until = Deadline::min();  // set once this thread spins
  auto may_lead = [&] { return !role_.held(lock) && notes_.size() < endpoint::kMaxPendingNotes; };
  // A message there already is taken leanly (look_leanly); one that comes
  // while this wait leads, leanly too (lead()).
  if (!ready() && may_lead() && may_look_leanly() && look_leanly(lock, ready)) {
    return true;
  }
  // What we wait for may depend on the credits held back: they go before
  // the wait (as credits_go_when_idle says), unless frames wait in the
  // channel, which may hold it already, and this thread is to read them.
  // Then it takes those first, and sends the credits at a look that finds
  // nothing (lead(), as before the wait), or once due, at the wait's end
  // (lead()) or before a wait for a receive (wait_receive): a receiver
  // behind a fast sender sends one frame of credits every eight 4 KiB
  // messages of a stream, not one a message.
  if (credits_.any_held() && credits_go_when_idle() && !ready() &&
      !(channel_.frames_in_place() && may_lead() && channel_.has_incoming())) {
    lock.unlock();
    flush().ignore();  // a failure breaks the endpoint: ready() says so
    lock.lock();
  }
  bool past_deadline = false;  // as lead() found it
  while (!ready()) {
    if (past_deadline) return false;
    if (may_lead()) {
      const ReaderRole::Held role = role_.take(lock);
      past_deadline = !lead(role, lock, deadline, ready);  // its first look still under mu_
      continue;
    }
    const Deadline now = Clock::now();
    if (now >= deadline.get()) return false;
    if (spin_until == Deadline::min()) spin_until = std::min(deadline.get(), now + busy_poll_);
    if (now < spin_until) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      ++sleepers_;
      cv_.wait_until(lock, deadline.get(), [&] { return ready() || may_lead(); });
      --sleepers_;
    }
  }
  return true;
}

// A wait's first look at a frames-in-place channel, when it may lead and
// may_look_leanly() (mu_ held through `lock`, and never let go of while it
// reads): takes the credits and the first inline message at the channel's
// front where they lie (take_frames_in_place, Take::kLeanly), and then
// whether `ready`. Nobody may take the reader role while this thread holds
// mu_, so it reads without taking it, and without pump()'s bookkeeping for
// replies, which these frames never write: on every message's path, a
// wait whose message is there costs one hold of mu_ and this one look.
// Does what lead() does after a look that took frames (moves posted sends
// on, wakes the waiters, sends the credits that are due), with `lock` held
// on return. False when the wait goes on (nothing came, another kind of
// frame comes first, or reading failed): await's full path follows, and
// meets that frame, or the failure, again.
template <typename Pred>
bool EndpointImpl::look_leanly(StateLock& lock, Pred ready) {
  bool progressed = false;
  const Result<bool> took =
      take_frames_in_place(ReaderRole::lean(lock), progressed, lock, Take::kLeanly);
  if (!progressed) return false;
  role_.count_lead(lock);  // as a lead: the endpoint's server leaves the channel to the callers
  wake_sleepers(lock);
  if (send_work_ready(lock)) {
    lock.unlock();
    progress_sends();
    lock.lock();
  }
  if (!took.ok() || !ready()) return false;
  if (credits_.any_held_now() && credits_.due()) {
    lock.unlock();
    flush().ignore();  // a failure breaks the endpoint: the caller's next look tells
    lock.lock();
  }
  return true;
}

// Reads as the reader role's holder (taken by await, which holds mu_
// through `lock`) until `ready`, the deadline, the endpoint closing or
// notifications piling up; then gives the role back. The first look at the
// channel goes on under mu_ (the messages and credits it takes take it
// anyway), and the function returns with `lock` held, so that a wait whose
// message is there takes mu_ once: for the look, the role's return and the
// caller's own look at what it waited for. False when it stopped at the
// deadline. Once a look finds nothing it spins for the busy-poll window,
// then keeps looking, yielding, for as long as stretch_ says the waits
// before needed, then sleeps on the channel.
template <typename Pred>
bool EndpointImpl::lead(const ReaderRole::Held& role, StateLock& lock, WaitDeadline& deadline,
                        Pred ready) {
  Deadline spin_until = Deadline::min();  // set when a look finds nothing
  Deadline idle_since;                    // that look's time
  Deadline yield_until;                   // spin_until and the stretch (SpinStretch)
  bool core_shared = false;               // a peer may run on this core (relax)
  bool slept = false;                     // since idle_since
  Status st;
  bool in_time = true;
  auto done = [&] { return ready() || notes_.size() >= endpoint::kMaxPendingNotes; };
  while (true) {
    bool progressed = false;
    // One small message per look (Take::kUpToAMessage): the caller returns
    // with it at once, and the receive it posts next adds its credit to
    // those held back (sent once due, or when a look finds nothing) while
    // the messages behind wait in the channel. Taking all the ring held
    // first (a steady sender's 16 messages) left the sender without
    // credits meanwhile: 4 KiB messages streamed at 1.8 M/s, not 2.3.
    if (may_look_leanly()) {
      // As pump() would take them, without its bookkeeping for replies (see
      // look_leanly); what it stops at, pump() takes.
      Result<bool> took = take_frames_in_place(role, progressed, lock, Take::kLeanly);
      st = took.status();
      if (st.ok() && !*took && channel_has_more()) {
        st = pump(role, progressed, lock, Take::kUpToAMessage);
      }
    } else {
      st = pump(role, progressed, lock, Take::kUpToAMessage);
    }
    if (!lock.owns_lock()) lock.lock();
    if (st.ok() && send_work_ready(lock)) {
      // Credits came for posted sends, or their writes finished: whatever
      // this caller waits for, the sends go on.
      lock.unlock();
      progress_sends();
      progressed = true;
      lock.lock();
    }
    if (!st.ok() || done()) {
      // A clock read only after a sleep: none between a message that came
      // while spinning and the return (see await). (Or the notifications
      // piled up, or reading failed: rare enough to learn from alike.)
      if (slept) stretch_.learn_from_sleep(Clock::now() - idle_since, busy_poll_);
      break;
    }
    if (progressed) wake_sleepers(lock);
    lock.unlock();
    const Deadline now = Clock::now();
    if (now >= deadline.get()) {
      // The stretch was spent and nothing came: a quiet peer costs a few
      // stretched waits, not a core (not so a deadline inside the window).
      if (spin_until != Deadline::min() && yield_until > spin_until) stretch_.missed();
      in_time = false;
      lock.lock();
      break;
    }
    if (progressed) {
      // Not what this caller waits for (credits, another caller's message):
      // the stretch learns from answers alone (above).
      spin_until = Deadline::min();  // spin afresh
      slept = false;
      continue;
    }
    // Nothing came: the peer may wait for the credits held back (await).
    if (credits_.any_held() && credits_go_when_idle()) {
      flush().ignore();  // a failure breaks the endpoint: the next pump tells
      continue;
    }
    if (spin_until == Deadline::min()) {
      idle_since = now;
      spin_until = std::min(deadline.get(), now + busy_poll_);
      yield_until = std::min(deadline.get(), spin_until + stretch_.length());
      // The ring hears where this side waits even when one_cpu_ settles it.
      core_shared = channel_.peer_waits_on_this_cpu() || one_cpu_;
    }
    if (now < spin_until) {
      relax(core_shared);
    } else if (now < yield_until) {
      std::this_thread::yield();  // a peer on this core runs meanwhile
    } else {
      slept = true;
      if (!sleep_on_channel(role, deadline.get())) {
        lock.lock();
        break;  // closing; other outcomes: the next pump tells
      }
    }
  }
  role_.count_lead(lock);
  release_role(lock);  // and wakes a follower, which may lead now
  if (!st.ok()) {
    lock.unlock();
    fail_reading(st);
    lock.lock();
  } else if (credits_.any_held_now() && credits_.due()) {
    // The messages read may have left the peer with no more credits than
    // are held back: they go now, not with the next frame.
    lock.unlock();
    flush().ignore();  // a failure breaks the endpoint: the caller's next look tells
    lock.lock();
  }
  return in_time;
}

// Takes the oldest of `queue` (handles, lent memory come back), waiting up
// to `timeout` (then kDeadlineExceeded, saying `late`).
template <typename T>
Result<T> EndpointImpl::take_next(std::deque<T>& queue, std::chrono::milliseconds timeout,
                                  const char* late) {
  StateLock lock(mu_);
  WaitDeadline deadline(timeout);
  if (!await(lock, deadline, [&] { return !queue.empty() || !broken_.ok(); })) {
    return DeadlineExceeded(late);
  }
  if (queue.empty()) return broken_;
  T next = std::move(queue.front());
  queue.pop_front();
  return next;
}

}  // namespace rdmabuf
