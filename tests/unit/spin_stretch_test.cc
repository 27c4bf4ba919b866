#include "core/spin_stretch.h"

#include <gtest/gtest.h>

namespace rdmabuf {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;

constexpr microseconds kWindow{200};

TEST(SpinStretch, StartsAtNothing) {
  EXPECT_EQ(SpinStretch().length(), nanoseconds::zero());
}

TEST(SpinStretch, AWaitThatDidNotSleepLeavesItAsItIs) {
  SpinStretch stretch;
  stretch.learn(microseconds(300), /*slept=*/false, kWindow);
  EXPECT_EQ(stretch.length(), nanoseconds::zero());
  stretch.learn(microseconds(600), /*slept=*/true, kWindow);
  EXPECT_EQ(stretch.length(), microseconds(500));
  stretch.learn(microseconds(50), /*slept=*/false, kWindow);
  EXPECT_EQ(stretch.length(), microseconds(500));
}

TEST(SpinStretch, ASleepJustPastTheWindowStretchesTheNextWaitsPastIt) {
  SpinStretch stretch;
  stretch.learn(microseconds(600), /*slept=*/true, kWindow);
  // 400 us past the window, and a quarter more.
  EXPECT_EQ(stretch.length(), microseconds(500));
  // The next wait, answered as late, now comes within window + stretch.
  EXPECT_GT(kWindow + stretch.length(), microseconds(600));
}

TEST(SpinStretch, NeverMoreThanItsWindows) {
  SpinStretch stretch;
  const nanoseconds most = kWindow * SpinStretch::kMostWindows;
  stretch.learn(kWindow + most, /*slept=*/true, kWindow);
  EXPECT_EQ(stretch.length(), most);
  // Just past the last window: a quiet peer, not a late answer.
  stretch.learn(kWindow + most + nanoseconds(1), /*slept=*/true, kWindow);
  EXPECT_EQ(stretch.length(), most / 2);
}

TEST(SpinStretch, AWaitThatSpentTheStretchInVainHalvesIt) {
  SpinStretch stretch;
  stretch.learn(microseconds(1000), /*slept=*/true, kWindow);
  ASSERT_EQ(stretch.length(), microseconds(1000));
  stretch.missed();
  EXPECT_EQ(stretch.length(), microseconds(500));
  for (int i = 0; i < 40; ++i)
    stretch.missed();
  EXPECT_EQ(stretch.length(), nanoseconds::zero());
}

TEST(SpinStretch, LongSleepsHalveItUntilItIsGone) {
  SpinStretch stretch;
  stretch.learn(microseconds(1000), /*slept=*/true, kWindow);
  EXPECT_EQ(stretch.length(), microseconds(1000));
  stretch.learn(std::chrono::milliseconds(50), /*slept=*/true, kWindow);  // the peer went quiet
  EXPECT_EQ(stretch.length(), microseconds(500));
  for (int i = 0; i < 40; ++i)
    stretch.learn(std::chrono::seconds(1), /*slept=*/true, kWindow);
  EXPECT_EQ(stretch.length(), nanoseconds::zero());
}

TEST(SpinStretch, NoStretchWhileSpinningIsOff) {
  SpinStretch stretch;
  stretch.learn(microseconds(30), /*slept=*/true, nanoseconds::zero());
  EXPECT_EQ(stretch.length(), nanoseconds::zero());
}

TEST(SpinStretch, ASleepEndedInsideTheWindowShrinksIt) {
  SpinStretch stretch;
  stretch.learn(microseconds(800), /*slept=*/true, kWindow);
  const nanoseconds learned = stretch.length();
  // A sleep that ended inside the window (lead() sleeps only past it): no
  // late answer to cover, so it counts as a miss.
  stretch.learn(microseconds(100), /*slept=*/true, kWindow);
  EXPECT_EQ(stretch.length(), learned / 2);
}

}  // namespace
}  // namespace rdmabuf
