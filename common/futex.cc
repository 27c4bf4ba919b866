#include "common/futex.h"

#include "common/futex_mutex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace rdmabuf {

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
  // Taken as kContended from here on, even when no other thread sleeps:
  // at worst one wake-up too many at unlock.
  while (word_.exchange(kContended, std::memory_order_acquire) != kFree) {
    futex_wait_until(word_, kContended, Deadline::max());  // (an hour at a time)
  }
}

}  // namespace rdmabuf
