#include "core/notifications.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
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

// A handler that replaces itself while another call of it waits (for
// this one, say) does not wait for that call.
TEST(NotificationQueueTest, AHandlerReplacingItselfWaitsForNoOtherCall) {
  NotificationQueue queue;
  std::promise<void> first_in, let_first_go;
  std::shared_future<void> first_may_go = let_first_go.get_future().share();
  queue.set_handler([&](const Notification& n) {
    if (n.tag == 1) {
      first_in.set_value();
      first_may_go.wait();
      return;
    }
    queue.set_handler({});
  });
  std::thread first([&] { EXPECT_TRUE(queue.try_push(numbered(1)).ok()); });
  ASSERT_EQ(first_in.get_future().wait_for(10s), std::future_status::ready);
  auto second = std::async(std::launch::async, [&] { return queue.try_push(numbered(2)); });
  EXPECT_EQ(second.wait_for(10s), std::future_status::ready)
      << "the replacing handler waited for the other call";
  let_first_go.set_value();
  first.join();
}

// The last reference to a handler that replaced itself is its call's own;
// what it captured goes without the queue's lock, so it may use the queue.
TEST(NotificationQueueTest, AReplacedHandlersCapturesGoWithoutTheQueuesLock) {
  NotificationQueue queue;
  struct PushesWhenGone {
    explicit PushesWhenGone(NotificationQueue* q) : queue(q) {}
    ~PushesWhenGone() { EXPECT_TRUE(queue->try_push(numbered(9)).ok()); }
    NotificationQueue* queue;
  };
  auto captured = std::make_shared<PushesWhenGone>(&queue);
  queue.set_handler([captured, &queue](const Notification&) { queue.set_handler({}); });
  captured.reset();  // the handler holds the last reference
  auto delivered = std::async(std::launch::async, [&] { return queue.try_push(numbered(1)); });
  ASSERT_EQ(delivered.wait_for(10s), std::future_status::ready) << "a capture went under the lock";
  EXPECT_TRUE(delivered.get().ok());
  // Pushed as the capture went, with no handler left: queued.
  EXPECT_EQ(queue.pop(0ms)->tag, 9u);
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
