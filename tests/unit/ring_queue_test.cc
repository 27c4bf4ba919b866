// RingQueue (common/ring_queue.h): order across growth while the ring has
// wrapped, removal from anywhere, and slots that let go of what they held.
#include "common/ring_queue.h"

#include <gtest/gtest.h>

#include <deque>
#include <memory>

namespace rdmabuf {
namespace {

TEST(RingQueue, KeepsOrderWhileItWrapsAndGrows) {
  RingQueue<int> queue;
  std::deque<int> expected;
  int next = 0;
  // Uneven pushes and pops: the front moves round the ring, and the ring
  // doubles (16, 32, 64, 128) while its front is part way round.
  for (int round = 0; round < 200; ++round) {
    for (int i = 0; i < round % 7 + 1; ++i) {
      queue.push_back(int{next});
      expected.push_back(next++);
    }
    for (int i = 0; i < round % 5 && !expected.empty(); ++i) {
      ASSERT_EQ(queue.front(), expected.front()) << "round " << round;
      queue.take_front();
      expected.pop_front();
    }
    ASSERT_EQ(queue.size(), expected.size());
  }
  while (!expected.empty()) {
    ASSERT_EQ(queue.front(), expected.front());
    queue.take_front();
    expected.pop_front();
  }
  EXPECT_TRUE(queue.empty());
}

TEST(RingQueue, ErasesTheFirstMatchAndKeepsTheOthersInOrder) {
  RingQueue<int> queue;
  for (int i = 0; i < 10; ++i)
    queue.push_back(int{i});
  for (int i = 0; i < 4; ++i)
    queue.take_front();  // 4..9 left, the front part way round
  for (int i = 10; i < 20; ++i)
    queue.push_back(int{i});                                         // wraps
  EXPECT_TRUE(queue.erase_first_if([](int v) { return v == 4; }));   // the front
  EXPECT_TRUE(queue.erase_first_if([](int v) { return v == 12; }));  // the middle
  EXPECT_TRUE(queue.erase_first_if([](int v) { return v == 19; }));  // the back
  EXPECT_FALSE(queue.erase_first_if([](int v) { return v == 12; })) << "erased already";
  EXPECT_TRUE(queue.erase_first_if([](int v) { return v % 2 == 1; })) << "the oldest odd: 5";
  std::vector<int> left;
  while (!queue.empty()) {
    left.push_back(queue.front());
    queue.take_front();
  }
  EXPECT_EQ(left, (std::vector<int>{6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18}));
}

TEST(RingQueue, ATakenOrErasedSlotLetsGoOfWhatItHeldAtOnce) {
  auto held = std::make_shared<int>(7);
  RingQueue<std::shared_ptr<int>> queue;
  queue.push_back(std::shared_ptr<int>(held));
  queue.push_back(std::shared_ptr<int>(held));
  queue.push_back(std::shared_ptr<int>(held));
  EXPECT_EQ(held.use_count(), 4);
  queue.take_front();
  EXPECT_EQ(held.use_count(), 3);
  {
    std::shared_ptr<int> taken = queue.take_front();
    EXPECT_EQ(held.use_count(), 3) << "moved out, not copied";
  }
  EXPECT_EQ(held.use_count(), 2) << "the slot taken from keeps nothing";
  queue.push_back(std::shared_ptr<int>(held));
  EXPECT_EQ(held.use_count(), 3);
  EXPECT_TRUE(queue.erase_first_if([](const std::shared_ptr<int>& p) { return p != nullptr; }));
  EXPECT_EQ(held.use_count(), 2) << "the slot the last element moved out of still held it";
  queue.take_front();
  EXPECT_EQ(held.use_count(), 1);
  EXPECT_TRUE(queue.empty());
}

}  // namespace
}  // namespace rdmabuf
