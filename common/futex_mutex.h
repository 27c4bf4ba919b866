// A mutex on one futex word, for locks taken on every message: inline,
// lock is one atomic instruction, and unlock a plain store and a load (a
// locked exchange where membarrier(2) is missing; see unlock()), where
// std::mutex calls into pthread_mutex_lock (about 30 instructions a call,
// and some 60 a lock and unlock together, seven times per endpoint round
// trip). Under contention it spins briefly, then sleeps on the word;
// unlock wakes one sleeper. Not recursive; unlock only by the holder.
// Unlike std::mutex, it must not be destroyed while a thread may still be
// inside unlock() (which reads the mutex after letting go): the endpoint's
// callers and threads keep its state alive while they call in. Works with
// std::lock_guard, FutexLock (below) and std::condition_variable_any.
// ThreadSanitizer is told it is a mutex (annotations below), so it checks
// the code it guards as it checks code under std::mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>  // std::defer_lock_t

#include "common/futex.h"
#include "common/sanitizers.h"

#ifdef RDMABUF_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace rdmabuf {

class FutexMutex {
 public:
  FutexMutex() = default;
  FutexMutex(const FutexMutex&) = delete;
  FutexMutex& operator=(const FutexMutex&) = delete;

  void lock() {
#ifdef RDMABUF_UNDER_TSAN
    __tsan_mutex_pre_lock(this, 0);
#endif
    uint32_t expected = kFree;
    if (!word_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
      lock_contended();
    }
#ifdef RDMABUF_UNDER_TSAN
    __tsan_mutex_post_lock(this, 0, 0);
#endif
  }

  bool try_lock() {
#ifdef RDMABUF_UNDER_TSAN
    __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
#endif
    uint32_t expected = kFree;
    const bool took = word_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                                    std::memory_order_relaxed);
#ifdef RDMABUF_UNDER_TSAN
    __tsan_mutex_post_lock(this, took ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed, 0);
#endif
    return took;
  }

  void unlock() {
#ifdef RDMABUF_UNDER_TSAN
    __tsan_mutex_pre_unlock(this, 0);
#endif
    // Against lock_contended(), which counts itself in waiters_ and then
    // looks at word_ (Dekker): one of the two must fence between its store
    // and its load. Where the process is registered for membarrier's
    // private expedited command, the sleeper pays for both (see there), and
    // a plain store here does not wait for the critical section's stores
    // to reach the cache, as a locked instruction does. Elsewhere the
    // exchange is the fence.
    if (unlock_skips_fence()) {
      word_.store(kFree, std::memory_order_release);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler keeps the order
    } else {
      word_.exchange(kFree, std::memory_order_seq_cst);
    }
    if (waiters_.load(std::memory_order_seq_cst) != 0) [[unlikely]]
      futex_wake_one(word_);
#ifdef RDMABUF_UNDER_TSAN
    __tsan_mutex_post_unlock(this, 0);
#endif
  }

 private:
  static constexpr uint32_t kFree = 0, kHeld = 1;

  // Out of line: spins a little while the holder is likely about to let
  // go, then counts itself in waiters_ and sleeps until the word is free.
  void lock_contended();

  std::atomic<uint32_t> word_{kFree};
  // Threads in lock_contended() that may sleep on word_: unlock wakes one.
  std::atomic<uint32_t> waiters_{0};
};

// A std::unique_lock for FutexMutex, without unique_lock's checks for
// misuse: they throw, which keeps GCC from inlining unlock(), and the
// endpoint takes and lets go of its lock several times a message. Misuse
// (unlock() while not held) is a bug, not an exception. Usable with
// std::condition_variable_any.
class FutexLock {
 public:
  explicit FutexLock(FutexMutex& mu) : mu_(mu) { lock(); }
  FutexLock(FutexMutex& mu, std::defer_lock_t) : mu_(mu) {}
  FutexLock(FutexMutex& mu, std::try_to_lock_t) : mu_(mu), owns_(mu.try_lock()) {}
  ~FutexLock() {
    if (owns_) mu_.unlock();
  }
  FutexLock(const FutexLock&) = delete;
  FutexLock& operator=(const FutexLock&) = delete;

  void lock() {
    mu_.lock();
    owns_ = true;
  }
  void unlock() {
    owns_ = false;
    mu_.unlock();
  }
  bool owns_lock() const { return owns_; }

 private:
  FutexMutex& mu_;
  bool owns_ = false;
};

}  // namespace rdmabuf
