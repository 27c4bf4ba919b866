#include "core/notifications.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;

Notification numbered(uint32_t tag) {
  Notification n;
  n.tag = tag;
  return n;
}

TEST(NotificationQueueTest, WithoutAHandlerNotificationsQueueInOrder) {
  NotificationQueue queue;
  ASSERT_TRUE(queue.try_push(numbered(1)).ok());
  ASSERT_TRUE(queue.try_push(numbered(2)).ok());
  EXPECT_EQ(queue.pop(0ms)->tag, 1u);
  EXPECT_EQ(queue.pop(0ms)->tag, 2u);
  EXPECT_EQ(queue.pop(0ms).status().code(), StatusCode::kDeadlineExceeded);
}

// What a handler uses may go once it is replaced: the replacing call
// returns only after the old handler's call under way has.
TEST(NotificationQueueTest, ReplacingTheHandlerWaitsForItsCallUnderWay) {
  NotificationQueue queue;
  std::promise<void> called, let_go;
  std::shared_future<void> let_go_seen = let_go.get_future().share();
  queue.set_handler([&](const Notification&) {
    called.set_value();
    let_go_seen.wait();
  });
  std::thread deliverer([&] { EXPECT_TRUE(queue.try_push(numbered(1)).ok()); });
  ASSERT_EQ(called.get_future().wait_for(10s), std::future_status::ready);

  auto replaced = std::async(std::launch::async, [&] { queue.set_handler({}); });
  EXPECT_EQ(replaced.wait_for(200ms), std::future_status::timeout)
      << "returned while the old handler still ran";
  let_go.set_value();
  EXPECT_EQ(replaced.wait_for(10s), std::future_status::ready);
  deliverer.join();
  // No handler now: the next one queues.
  ASSERT_TRUE(queue.try_push(numbered(2)).ok());
  EXPECT_EQ(queue.pop(0ms)->tag, 2u);
}

TEST(NotificationQueueTest, AHandlerMayReplaceItselfWithoutWaitingForItself) {
  NotificationQueue queue;
  int calls = 0;
  queue.set_handler([&](const Notification&) {
    ++calls;
    queue.set_handler({});
  });
  auto delivered = std::async(std::launch::async, [&] { return queue.try_push(numbered(1)); });
  ASSERT_EQ(delivered.wait_for(10s), std::future_status::ready) << "the handler waited for itself";
  EXPECT_TRUE(delivered.get().ok());
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(queue.try_push(numbered(2)).ok());
  EXPECT_EQ(queue.pop(0ms)->tag, 2u);
}

TEST(NotificationQueueTest, AHandlerThatThrowsIsNoLongerUnderWay) {
  NotificationQueue queue;
  queue.set_handler([](const Notification&) { throw std::runtime_error("handler failed"); });
  EXPECT_THROW((void)queue.try_push(numbered(1)), std::runtime_error);
  auto replaced = std::async(std::launch::async, [&] { queue.set_handler({}); });
  EXPECT_EQ(replaced.wait_for(10s), std::future_status::ready);
}

}  // namespace
}  // namespace rdmabuf
