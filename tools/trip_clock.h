// The clock a ping-pong reads once a trip (`rdmabuf bench --op send`,
// rdmabuf_ping_pong): the CPU's time-stamp counter where it ticks at one
// rate whatever the core's frequency and sleep state (x86's invariant TSC),
// else std::chrono::steady_clock.
//
// Why: a trip's figure includes one read of the clock, and on the AMD EPYC
// host (a KVM guest) steady_clock (the vDSO's clock_gettime) takes 24 ns a
// read against the counter's 9.6, in an 8 B trip through shared memory of
// about 300 ns. ucx_perftest, whose figures stand beside rdmabuf's, times
// its iterations by the same counter (ucs_get_time).
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace rdmabuf::tool {

class TripClock {
 public:
  using Ticks = uint64_t;

  // Measures the counter's rate against steady_clock over `calibration`
  // (20 ms: a rate within about 1e-4) where the counter is used.
  explicit TripClock(std::chrono::milliseconds calibration = std::chrono::milliseconds(20)) {
    if (!has_invariant_counter()) return;
    const auto t0 = std::chrono::steady_clock::now();
    const Ticks c0 = counter();
    std::this_thread::sleep_for(calibration);
    const auto t1 = std::chrono::steady_clock::now();
    const Ticks c1 = counter();
    const double micros = std::chrono::duration<double, std::micro>(t1 - t0).count();
    if (c1 > c0 && micros > 0) ticks_per_micro_ = static_cast<double>(c1 - c0) / micros;
  }

  // Whether it reads the time-stamp counter (else steady_clock).
  bool uses_counter() const { return ticks_per_micro_ > 0; }

  Ticks now() const {
    if (uses_counter()) return counter();
    return static_cast<Ticks>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now().time_since_epoch())
                                  .count());
  }

  // Microseconds from `from` to `to`, both from now().
  double micros(Ticks from, Ticks to) const {
    const double elapsed = static_cast<double>(to - from);
    return uses_counter() ? elapsed / ticks_per_micro_ : elapsed / 1e3;
  }

 private:
  static bool has_invariant_counter() {
#if defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0) return false;
    return ((edx >> 8) & 1) != 0;  // "TscInvariant"
#else
    return false;
#endif
  }

  static Ticks counter() {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return 0;  // never called: has_invariant_counter() is false
#endif
  }

  double ticks_per_micro_ = 0;  // 0: steady_clock
};

}  // namespace rdmabuf::tool
