#include "common/futex.h"

#include "common/futex_mutex.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

#include "common/membarrier.h"

namespace rdmabuf {
namespace {

bool register_private_expedited() {
  return register_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED,
                             MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
}

// The child of a fork() runs one thread: it registers again (harmless if
// it kept its parent's registration), or unlocks with fences from now on,
// before any other thread can start.
void register_again_in_child() {
  futex_detail::unlock_skips_fence = register_private_expedited();
}

bool register_at_load() {
  if (!register_private_expedited()) return false;
  pthread_atfork(nullptr, nullptr, register_again_in_child);
  return true;
}

}  // namespace

namespace futex_detail {
// Zero (unlocks fence) until this initialiser runs, as the library loads;
// a thread already waiting then fences before its next look (see
// lock_contended).
bool unlock_skips_fence = register_at_load();
}  // namespace futex_detail

bool fence_other_threads() {
  return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

void futex_wait_until(std::atomic<uint32_t>& word, uint32_t expected, Deadline deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return;
  // Cap single sleeps so a far deadline never overflows timespec.
  auto capped = std::min<Clock::duration>(left, std::chrono::hours(1));
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(capped);
  timespec ts{static_cast<time_t>(secs.count()),
              static_cast<long>(
                  std::chrono::duration_cast<std::chrono::nanoseconds>(capped - secs).count())};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr,
          0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

void futex_wake_one(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

void FutexMutex::lock_contended() {
  constexpr int kSpins = 100;
  for (int i = 0; i < kSpins; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    uint32_t expected = kFree;
    if (word_.load(std::memory_order_relaxed) == kFree &&
        word_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      return;
    }
  }
  // To sleep: counted in waiters_ first, then a look at word_, and a sleep
  // only while the word still holds what that look saw. The unlock stores
  // kFree, then loads waiters_ (Dekker): one side fences between its store
  // and its load. The locked increment is this side's; the unlock's is
  // either its own exchange or, when it skips it, the membarrier below,
  // which makes every running thread of the process pass a fence (one not
  // running passed one when it was switched out). So either the look sees
  // kFree, or the unlock sees this thread counted and wakes one. One
  // membarrier covers the whole wait: every lock is taken with a locked
  // read-modify-write, so a thread that takes it after the increment sees
  // the count at its unlock. The membarrier is issued before the first
  // look that finds unlocks skipping their fence, should that start while
  // this thread waits (the flag is set as the library loads). Should the
  // membarrier fail, an unlock may miss this thread: it then looks again
  // every millisecond rather than sleeping for good.
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool fenced = false;  // for unlocks that skip their fence
  while (true) {
    if (unlock_skips_fence() && !fenced) fenced = fence_other_threads();
    uint32_t seen = word_.load(std::memory_order_seq_cst);
    if (seen == kFree) {
      if (word_.compare_exchange_strong(seen, kHeld, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
        break;
      }
      continue;  // taken meanwhile: look again
    }
    const bool missable = unlock_skips_fence() && !fenced;
    futex_wait_until(word_, seen,
                     Clock::now() + (missable ? Clock::duration(std::chrono::milliseconds(1))
                                              : Clock::duration(std::chrono::hours(1))));
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace rdmabuf
