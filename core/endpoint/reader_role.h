// Who may read an endpoint's channel now: the reader role.
//
// Frames are read and dispatched, in order, by whichever thread holds the
// role. Five kinds of thread take it, each under the endpoint's state lock:
//   - a caller that waits for the peer (a credit, a message, a reply:
//     EndpointImpl::await), so that what it waits for reaches it with no
//     hand-off between threads;
//   - a caller's lean look at a ring (look_leanly), which reads under the
//     state lock without taking the role: nobody can take it meanwhile;
//   - the endpoint's server (server.h), when no caller has read lately;
//   - a waiter for notifications (look_for_notes);
//   - a writer blocked on a full channel (read_while_blocked), so that two
//     sides that both write more than their channel holds do not wait on
//     each other for ever.
// The holder alone touches the reading state (EndpointImpl::Reading); the
// role changes hands only under the state lock, which orders the holders'
// accesses one after another.
//
// Functions that read as the holder take `const ReaderRole::Held&`: only
// take() makes one.
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <thread>

#include "core/endpoint/state_lock.h"

namespace rdmabuf::endpoint {

class ReaderRole {
 public:
  // Proof that the calling thread holds the role (or reads leanly under the
  // state lock, which keeps it from anyone else).
  class Held {
   private:
    friend class ReaderRole;
    Held() = default;
  };

  bool held(const StateLock&) const { return reading_; }
  bool held_by_this_thread(const StateLock&) const {
    return reading_ && holder_ == std::this_thread::get_id();
  }
  // Takes the role (not held).
  Held take(const StateLock&) {
    reading_ = true;
    holder_ = std::this_thread::get_id();
    return Held();
  }
  // The role is this thread's already (taken by a wait up the stack).
  Held confirm(const StateLock& lock) const {
    assert(held_by_this_thread(lock));
    (void)lock;
    return Held();
  }
  // A lean look's proof: the state lock held keeps the role free.
  static Held lean(const StateLock&) { return Held(); }
  // Gives the role back: true when the endpoint's server asked to be woken
  // then (want()).
  bool release(const StateLock&) {
    reading_ = false;
    if (wanted_.load(std::memory_order_relaxed)) [[unlikely]] {
      wanted_.store(false, std::memory_order_relaxed);
      return true;
    }
    return false;
  }
  // The endpoint's server found the role held and sleeps until its release.
  void want(const StateLock&) { wanted_.store(true, std::memory_order_relaxed); }
  // Read without the lock where it only spares a wake-up.
  bool wanted() const { return wanted_.load(std::memory_order_relaxed); }

  // The holder while it dispatches frames (inside a pump), else none: a
  // frame this thread writes meanwhile is a reply, held back. Set by that
  // thread alone, so a thread that finds its own id here is pumping.
  void begin_pump(const Held&) {
    pumping_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  void end_pump(const Held&) { pumping_.store(std::thread::id(), std::memory_order_relaxed); }
  bool pumping_here() const {
    return pumping_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }
  bool holder_is_pumping(const StateLock&) const {
    return pumping_.load(std::memory_order_relaxed) == holder_;
  }

  // A caller (or a look for notifications) is done holding the role, or took
  // frames in a lean look: counted for led_lately(). Only under the state
  // lock, which orders the changes: no read-modify-write.
  void count_lead(const StateLock&) {
    leads_.store(leads_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // Whether a caller held the role since the endpoint's server last asked.
  // The endpoint's server alone.
  bool led_lately() {
    const uint64_t leads = leads_.load(std::memory_order_relaxed);
    if (leads == leads_seen_) return false;
    leads_seen_ = leads;
    return true;
  }

 private:
  bool reading_ = false;    // state lock
  std::thread::id holder_;  // state lock; while reading_
  std::atomic<bool> wanted_{false};
  std::atomic<std::thread::id> pumping_{};
  std::atomic<uint64_t> leads_{0};
  uint64_t leads_seen_ = 0;  // the endpoint's server alone
};

}  // namespace rdmabuf::endpoint
