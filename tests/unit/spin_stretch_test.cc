#include "core/endpoint/spin_stretch.h"

#include <gtest/gtest.h>

namespace rdmabuf {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;

constexpr microseconds kWindow{200};

TEST(SpinStretch, StartsAtNothing) {
  EXPECT_EQ(SpinStretch().length(), nanoseconds::zero());
}

TEST(SpinStretch, ASleepJustPastTheWindowStretchesTheNextWaitsPastIt) {
  SpinStretch stretch;
  stretch.learn_from_sleep(microseconds(600), kWindow);
  // 400 us past the window, and a quarter more.
  EXPECT_EQ(stretch.length(), microseconds(500));
  // The next wait, answered as late, now comes within window + stretch.
  EXPECT_GT(kWindow + stretch.length(), microseconds(600));
}

TEST(SpinStretch, NeverMoreThanItsWindows) {
  SpinStretch stretch;
  const nanoseconds most = kWindow * SpinStretch::kMostWindows;
  stretch.learn_from_sleep(kWindow + most, kWindow);
  EXPECT_EQ(stretch.length(), most);
  // Just past the last window: a quiet peer, not a late answer.
  stretch.learn_from_sleep(kWindow + most + nanoseconds(1), kWindow);
  EXPECT_EQ(stretch.length(), most / 2);
}

TEST(SpinStretch, AWaitThatSpentTheStretchInVainHalvesIt) {
  SpinStretch stretch;
  stretch.learn_from_sleep(microseconds(1000), kWindow);
  ASSERT_EQ(stretch.length(), microseconds(1000));
  stretch.missed();
  EXPECT_EQ(stretch.length(), microseconds(500));
  for (int i = 0; i < 40; ++i)
    stretch.missed();
  EXPECT_EQ(stretch.length(), nanoseconds::zero());
}

TEST(SpinStretch, LongSleepsHalveItUntilItIsGone) {
  SpinStretch stretch;
  stretch.learn_from_sleep(microseconds(1000), kWindow);
  EXPECT_EQ(stretch.length(), microseconds(1000));
  stretch.learn_from_sleep(std::chrono::milliseconds(50), kWindow);  // the peer went quiet
  EXPECT_EQ(stretch.length(), microseconds(500));
  for (int i = 0; i < 40; ++i)
    stretch.learn_from_sleep(std::chrono::seconds(1), kWindow);
  EXPECT_EQ(stretch.length(), nanoseconds::zero());
}

TEST(SpinStretch, NoStretchWhileSpinningIsOff) {
  SpinStretch stretch;
  stretch.learn_from_sleep(microseconds(30), nanoseconds::zero());
  EXPECT_EQ(stretch.length(), nanoseconds::zero());
}

TEST(SpinStretch, ASleepEndedInsideTheWindowShrinksIt) {
  SpinStretch stretch;
  stretch.learn_from_sleep(microseconds(800), kWindow);
  const nanoseconds learned = stretch.length();
  // A sleep that ended inside the window (lead() sleeps only past it): no
  // late answer to cover, so it counts as a miss.
  stretch.learn_from_sleep(microseconds(100), kWindow);
  EXPECT_EQ(stretch.length(), learned / 2);
}

}  // namespace
}  // namespace rdmabuf
