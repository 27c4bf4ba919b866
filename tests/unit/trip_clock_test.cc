// TripClock (tools/trip_clock.h), the clock a ping-pong reads once a trip:
// whichever clock it reads, it measures an interval as steady_clock does.
#include "tools/trip_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace rdmabuf::tool {
namespace {

using namespace std::chrono_literals;

// A 200 ms sleep, timed by both clocks around the same interval: within
// 1% of each other (the counter's rate is calibrated over 20 ms), and a
// later reading is never earlier.
TEST(TripClockTest, MeasuresAnIntervalAsSteadyClockDoes) {
  const TripClock clock;
  std::printf("    reads the %s\n",
              clock.uses_counter() ? "time-stamp counter" : "steady clock (no invariant counter)");
  const auto steady_from = std::chrono::steady_clock::now();
  const TripClock::Ticks from = clock.now();
  std::this_thread::sleep_for(200ms);
  const TripClock::Ticks to = clock.now();
  const auto steady_to = std::chrono::steady_clock::now();
  const double steady_us =
      std::chrono::duration<double, std::micro>(steady_to - steady_from).count();
  EXPECT_GE(to, from);
  EXPECT_NEAR(clock.micros(from, to), steady_us, steady_us / 100);
  EXPECT_EQ(clock.micros(from, from), 0.0);
}

}  // namespace
}  // namespace rdmabuf::tool
