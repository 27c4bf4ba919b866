// Sleeping and waking on a 32-bit atomic word (Linux futex), with a deadline,
// and the spin-then-sleep policy every waiter in rdmabuf follows.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "rdmabuf/transfer.h"

namespace rdmabuf {

// Sleeps while `word` holds `expected`, until woken or `deadline`. May
// return early (spurious wake-ups); callers re-check their condition.
void futex_wait_until(std::atomic<uint32_t>& word, uint32_t expected, Deadline deadline);
// Wakes every thread sleeping on `word`.
void futex_wake_all(std::atomic<uint32_t>& word);
// Wakes one thread sleeping on `word`, if any.
void futex_wake_one(std::atomic<uint32_t>& word);

// Whether FutexMutex::unlock may skip its fence: this process is registered
// for membarrier(2)'s MEMBARRIER_CMD_PRIVATE_EXPEDITED, which a thread about
// to sleep on a FutexMutex then issues instead (the argument is in
// FutexMutex::lock_contended, common/futex.cc). Set as the library loads,
// and again in the child of a fork().
namespace futex_detail {
extern bool unlock_skips_fence;
}  // namespace futex_detail
inline bool unlock_skips_fence() {
  return futex_detail::unlock_skips_fence;
}
// Makes every running thread of this process pass a full memory fence
// (membarrier's private expedited command): false when it could not.
bool fence_other_threads();

// Spin-then-sleep: `spin()` returns true while the busy-poll window since the
// last activity lasts, yielding the CPU each time so spinners never starve
// the thread they wait for (wake-ups cost tens of microseconds in VMs; a
// yield costs well under one).
class BusyPoll {
 public:
  explicit BusyPoll(std::chrono::microseconds window) : window_(window) { activity(); }
  void activity() { since_ = Clock::now(); }
  // Yields and returns true while within the window; false when it is time to sleep.
  bool spin() {
    if (window_.count() <= 0 || Clock::now() - since_ >= window_) return false;
    sched_yield();
    return true;
  }

 private:
  std::chrono::microseconds window_;
  Clock::time_point since_;
};

}  // namespace rdmabuf
