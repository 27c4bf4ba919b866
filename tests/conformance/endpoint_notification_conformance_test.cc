// The conformance suite, endpoint notifications: a tagged write tells the
// owner once its bytes landed, in order, to a waiter or a handler, and holds
// the writer back rather than lose one; each backend in turn (fixture.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tests/conformance/endpoint_pair.h"
#include "tests/conformance/fixture.h"
#include "tests/helpers/backend_detail.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/printers.h"
#include "tests/helpers/sanitizer.h"

namespace rdmabuf::conformance {
namespace {

TEST_P(ConformanceTest, EndpointTaggedWriteNotifiesTheOwnerAfterTheBytesLanded) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  Owned target = own(1 << 20, 0);
  // The handler checks the bytes at the moment it is told: they must be there.
  std::mutex mu;
  std::vector<std::string> seen;
  owner_->set_notification_handler([&](const Notification& n) {
    std::lock_guard lock(mu);
    ScopedIgnoreReads quiet;  // written by the owner's I/O thread (sanitizer.h)
    const auto held = bytes(target.memory);
    auto landed = held.span().subspan(n.offset, n.length);
    seen.push_back(std::to_string(n.tag) + "@" + std::to_string(n.offset) + "+" +
                   std::to_string(n.length) +
                   (find_mismatch(landed, n.tag, n.offset) ? " missing" : " landed") +
                   (n.buffer_id == target.handle.id() ? "" : " wrong buffer"));
  });
  for (uint32_t tag = 1; tag <= 4; ++tag) {
    const uint64_t offset = (tag - 1) * 256 << 10, length = 256 << 10;
    LocalMemory src = with_pattern(length, tag, offset);
    ASSERT_TRUE(sender->write(slice(target.handle, offset, length), src, tag, kTimeout).ok());
  }
  // The notification is sent after the write completed; give it its trip.
  const auto until = Clock::now() + kTimeout;
  while (Clock::now() < until) {
    std::lock_guard lock(mu);
    if (seen.size() == 4) break;
    std::this_thread::sleep_for(1ms);
  }
  owner_->set_notification_handler({});
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"1@0+262144 landed", "2@262144+262144 landed",
                                            "3@524288+262144 landed", "4@786432+262144 landed"}));
}

// Over ibverbs each notification came as a notice behind its write's bytes
// on the same queue pair (the owner's backend counts them); elsewhere as a
// frame after the write.
TEST_P(ConformanceTest, EndpointNotificationsQueueInOrderAndRefuseForeignBuffers) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  Owned target = own(8192, 0);
  for (uint32_t tag : {7u, 8u, 9u}) {
    ASSERT_TRUE(
        sender->write(slice(target.handle, 4096, 4096), with_pattern(4096, tag), tag, kTimeout)
            .ok());
  }
  for (uint32_t tag : {7u, 8u, 9u}) {
    auto n = owner_->next_notification(kTimeout);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(n->tag, tag);
    EXPECT_EQ(n->buffer_id, target.handle.id());
    EXPECT_EQ(n->offset, 4096u);
    EXPECT_EQ(n->length, 4096u);
    EXPECT_EQ(n->peer, receiver->peer());
  }
  EXPECT_EQ(owner_->next_notification(50ms).status().code(), StatusCode::kDeadlineExceeded);
  // (A write from GPU memory the NIC cannot reach goes through host memory,
  // and its notice by frame.)
  if (backend() == "ibverbs" && local_kind() == MemoryKind::kHost) {
    EXPECT_EQ(backend_detail(*owner_, "ibverbs", "notices taken"), "3");
    EXPECT_EQ(backend_detail(*owner_, "ibverbs", "notices refused"), "0");
  }
  // A tagged write goes to the endpoint's peer only.
  auto own_buffer = reader_->register_buffer(testing::allocate_of(remote_kind(), 64));
  ASSERT_TRUE(own_buffer.ok());
  EXPECT_EQ(sender->write(*own_buffer, allocate(64), 1, kTimeout).code(),
            StatusCode::kInvalidArgument);
}

// A waiter in next_notification that spins reads the endpoints' channels
// itself (NoticeTaker::look_for_notes), and hands the reading back to the
// endpoints' servers when it goes to sleep. Either way every notification
// comes once, in order: in a ping-pong of tagged writes (the waiter finds
// each), and after pauses past the busy-poll window (it sleeps, and the
// endpoint's server reads), with a message stream through the same
// endpoint meanwhile (frames the look takes for a caller's receives).
TEST_P(ConformanceTest, EndpointNotificationsFoundByALookingWaiterComeOnceInOrder) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  Owned target = own(4096, 0);
  const LocalMemory message = with_pattern(64, 7);
  uint32_t tag = 0;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Back to back: the waiter spins throughout and finds them.
    for (int i = 0; i < 100; ++i) {
      ++tag;
      ASSERT_TRUE(
          sender->write(slice(target.handle, 0, 64), with_pattern(64, tag), tag, kTimeout).ok());
      auto n = owner_->next_notification(kTimeout);
      ASSERT_TRUE(n.ok()) << n.status().to_string();
      ASSERT_EQ(n->tag, tag);
    }
    // A message through the same endpoint, read by a look or its receive.
    LocalMemory into = allocate(64);
    auto posted = receiver->post_receive(into);
    ASSERT_TRUE(posted.ok()) << posted.status().to_string();
    ASSERT_TRUE(sender->send(message, kTimeout).ok());
    // The waiter sleeps (past the busy-poll window), then a few come at once.
    auto waiting =
        std::async(std::launch::async, [&] { return owner_->next_notification(kTimeout); });
    std::this_thread::sleep_for(5ms);
    for (int i = 1; i <= 3; ++i) {
      ASSERT_TRUE(
          sender->write(slice(target.handle, 0, 64), with_pattern(64, tag + i), tag + i, kTimeout)
              .ok());
    }
    for (int i = 1; i <= 3; ++i) {
      auto n = i == 1 ? waiting.get() : owner_->next_notification(kTimeout);
      ASSERT_TRUE(n.ok()) << n.status().to_string();
      ASSERT_EQ(n->tag, tag + i);
    }
    tag += 3;
    auto size = posted->wait(kTimeout);
    ASSERT_TRUE(size.ok()) << size.status().to_string();
    EXPECT_EQ(*size, 64u);
    EXPECT_EQ(find_mismatch(bytes(into).span(), 7), std::nullopt);
  }
  EXPECT_EQ(owner_->next_notification(50ms).status().code(), StatusCode::kDeadlineExceeded);
}

// A handler runs on an endpoint's server (or a backend's), never inside a
// caller's call: not in a next_notification that spins meanwhile (which
// does not read the channels while a handler is set, and would not hand
// what it read to the handler).
TEST_P(ConformanceTest, EndpointNotificationHandlerNeverRunsInALookingWaitersCall) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  Owned target = own(4096, 0);
  std::mutex mu;
  std::vector<std::thread::id> ran_on;
  owner_->set_notification_handler([&](const Notification&) {
    std::lock_guard lock(mu);
    ran_on.push_back(std::this_thread::get_id());
  });
  std::thread::id waiter_id;
  // A jthread: an assertion that returns early still stops and joins it.
  std::jthread waiter([&](std::stop_token stop) {
    waiter_id = std::this_thread::get_id();
    while (!stop.stop_requested()) {
      // The handler takes them all: each wait ends at its deadline.
      EXPECT_EQ(owner_->next_notification(1ms).status().code(), StatusCode::kDeadlineExceeded);
    }
  });
  for (uint32_t tag = 1; tag <= 50; ++tag) {
    ASSERT_TRUE(
        sender->write(slice(target.handle, 0, 64), with_pattern(64, tag), tag, kTimeout).ok());
  }
  const auto until = Clock::now() + kTimeout;
  while (Clock::now() < until) {
    std::lock_guard lock(mu);
    if (ran_on.size() == 50) break;
    std::this_thread::sleep_for(1ms);
  }
  waiter.request_stop();
  waiter.join();
  owner_->set_notification_handler({});
  std::lock_guard lock(mu);
  ASSERT_EQ(ran_on.size(), 50u);
  for (const std::thread::id& id : ran_on)
    EXPECT_NE(id, waiter_id);
}

// Endpoints come and go while a waiter spins in next_notification, looking
// at their channels: a close waits for a look under way, and a look never
// touches an endpoint that has gone (the sanitizers' builds check that).
// A frame that needs an answer (a lend request) read by a look is answered
// all the same: a look writes nothing, the endpoint's server does.
TEST_P(ConformanceTest, EndpointsCloseWhileAWaiterLooksAtThem) {
  std::atomic<int> found{0};
  // A jthread: an assertion that returns early still stops and joins it.
  std::jthread waiter([&](std::stop_token stop) {
    while (!stop.stop_requested()) {
      if (owner_->next_notification(5ms).ok()) found.fetch_add(1);
    }
  });
  Owned target = own(4096, 0);
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
    ASSERT_TRUE(receiver && sender);
    ASSERT_TRUE(
        sender->write(slice(target.handle, 0, 64), with_pattern(64, round), round, kTimeout).ok());
    const auto until = Clock::now() + kTimeout;
    while (found.load() <= round && Clock::now() < until)
      std::this_thread::sleep_for(100us);
    auto lease = sender->request_remote_buffer(4096, 1s, kTimeout);
    ASSERT_TRUE(lease.ok()) << "the lend request was not answered: " << lease.status().to_string();
    // Closed from either side, while the waiter keeps looking.
    if (round % 2 == 0) {
      receiver->close();
    } else {
      sender->close();
    }
    receiver.reset();
    sender.reset();
  }
  waiter.request_stop();
  waiter.join();
  EXPECT_EQ(found.load(), 20);
}

// While the owner's notification handler is busy, tagged writes pile up:
// the writer is held back rather than any notification dropped, and once
// the handler goes on, every one comes, once, in order. Over ibverbs the
// handler runs on the thread that takes the notices, which stop at the
// receives the owner's side of the queue pair keeps posted (64); the
// writer's NIC then waits for more: its writes stall. Over the other
// transports the frames wait in the connection, and the writer stalls only
// once it is full.
TEST_P(ConformanceTest, EndpointNotificationsHoldTheWriterBackAndLoseNone) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  Owned target = own(64, 0);
  constexpr uint32_t kWrites = 1300;
  std::mutex mu;
  std::condition_variable cv;
  bool go_on = false;
  std::vector<uint32_t> tags;
  owner_->set_notification_handler([&](const Notification& n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return go_on; });
    tags.push_back(n.tag);
    cv.notify_all();
  });
  std::atomic<uint32_t> written{0};
  auto writing = std::async(std::launch::async, [&, &sender = sender] {
    LocalMemory src = with_pattern(64, 1);
    for (uint32_t tag = 0; tag < kWrites; ++tag) {
      Status st = sender->write(target.handle, src, tag, 60s);
      if (!st.ok()) return st;
      written++;
    }
    return Status::Ok();
  });
  // Long enough for the writer to run into the owner's limits (a write
  // takes well under a millisecond, even in the Soft-RoCE VM).
  std::this_thread::sleep_for(2s);
  // (GPU memory the NIC cannot reach is written through host memory, and
  // its notices go as frames: the other transports' case.)
  if (backend() == "ibverbs" && local_kind() == MemoryKind::kHost) {
    EXPECT_LT(written.load(), kWrites) << "the writer was not held back";
    EXPECT_GE(written.load(), 64u) << "the writer was held back too early";
  }
  {
    std::lock_guard lock(mu);
    go_on = true;
  }
  cv.notify_all();
  Status st = writing.get();
  EXPECT_TRUE(st.ok()) << st.to_string();
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, 30s, [&] { return tags.size() >= kWrites; });
  }
  owner_->set_notification_handler({});
  std::lock_guard lock(mu);
  ASSERT_EQ(tags.size(), kWrites);
  for (uint32_t i = 0; i < kWrites; ++i) {
    if (tags[i] != i) {
      ADD_FAILURE() << "notification " << i << " has tag " << tags[i];
      break;
    }
  }
}

}  // namespace
}  // namespace rdmabuf::conformance
