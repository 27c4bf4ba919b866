// The endpoints' servers (core/endpoint/server.h): what reads for an
// endpoint while no caller does runs on the manager's event loops and
// endpoint workers, not on a thread per endpoint. Threads do not grow with
// endpoints, and an endpoint whose server turn blocks (a notification
// handler that waits) holds up no other endpoint.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tests/conformance/endpoint_pair.h"
#include "tests/conformance/fixture.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/printers.h"
#include "tests/helpers/threads.h"

namespace rdmabuf::conformance {
namespace {

using namespace std::chrono_literals;
using testing::find_mismatch;

// One message each way on `pair` (host memory), every byte checked; ""
// when it went.
std::string exchange(const EndpointPair& pair, uint64_t seed) {
  for (auto [from, to] : {std::pair{pair.sender.get(), pair.receiver.get()},
                          std::pair{pair.receiver.get(), pair.sender.get()}}) {
    // A send waits for a receive posted: the receive goes first.
    auto received = std::async(std::launch::async, [to = to, seed]() -> std::string {
      LocalMemory into = LocalMemory::allocate(4096).value();
      auto size = to->receive(into, kTimeout);
      if (!size.ok()) return "receive: " + size.status().to_string();
      if (*size != 300) return "received " + std::to_string(*size) + " bytes, not 300";
      if (find_mismatch(into.span().first(300), seed)) return "bytes differ";
      return "";
    });
    LocalMemory message = LocalMemory::allocate(300).value();
    testing::fill_pattern(message.span(), seed);
    Status sent = from->send(message, kTimeout);
    std::string got = received.get();
    if (!sent.ok()) return "send: " + sent.to_string();
    if (!got.empty()) return got;
  }
  return "";
}

// Runs `in_callback` in the on_done of a read of `source` by `reader` (on
// one of its loops, over tcp and ibverbs); whether it ran in time.
bool run_in_a_transfers_callback(Manager& reader, const RemoteBuffer& source,
                                 const LocalMemory& into,
                                 const std::function<void()>& in_callback) {
  std::promise<void> ran;
  Transfer t = reader.submit(one(Op::read(source, into)), kTimeout, [&] {
    in_callback();
    ran.set_value();
  });
  const bool in_time = ran.get_future().wait_for(kTimeout) == std::future_status::ready;
  t.wait().ignore();  // returns once on_done has
  return in_time;
}

TEST_P(ConformanceTest, EndpointsDoNotEachCostAThread) {
  std::vector<EndpointPair> pairs;
  pairs.push_back(connect_endpoints(*owner_, *reader_));
  ASSERT_TRUE(pairs[0].receiver && pairs[0].sender);
  ASSERT_EQ(exchange(pairs[0], 1), "");  // the loops and a worker each have started
  const int before = testing::threads_of();
  constexpr int kMorePairs = 24;
  for (int i = 0; i < kMorePairs; ++i) {
    pairs.push_back(connect_endpoints(*owner_, *reader_));
    ASSERT_TRUE(pairs.back().receiver && pairs.back().sender) << "pair " << i;
    ASSERT_EQ(exchange(pairs.back(), 2 + i), "") << "pair " << i;
  }
  // One at a time, the turns need a worker or two on each side; a thread
  // per endpoint would have added 48.
  EXPECT_LE(testing::threads_of() - before, 6)
      << 2 * kMorePairs << " endpoints more; threads: " << testing::threads_of();
  // Every one still works, and none was kept from its peer's frames.
  for (size_t i = 0; i < pairs.size(); ++i)
    ASSERT_EQ(exchange(pairs[i], 100 + i), "") << "pair " << i;
}

TEST_P(ConformanceTest, ANotificationHandlerThatWaitsHoldsUpNoOtherEndpoint) {
  EndpointPair noted = connect_endpoints(*owner_, *reader_);
  EndpointPair other = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(noted.receiver && noted.sender && other.receiver && other.sender);
  Owned target = own(4096, 0);
  std::mutex mu;
  std::condition_variable cv;
  bool in_handler = false, let_go = false;
  owner_->set_notification_handler([&](const Notification&) {
    std::unique_lock lock(mu);
    in_handler = true;
    cv.notify_all();
    cv.wait_for(lock, kTimeout, [&] { return let_go; });
  });
  auto release_handler = [&] {
    std::lock_guard lock(mu);
    let_go = true;
    cv.notify_all();
  };
  ASSERT_TRUE(noted.sender->write(target.handle, with_pattern(4096, 5), 5, kTimeout).ok());
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kTimeout, [&] { return in_handler; })) << "the handler never ran";
  }
  // The owner's side of the other endpoint reads the lend request and
  // answers it with no caller of its own, while the handler waits.
  auto lease = other.sender->request_remote_buffer(4096, 10s, 10s);
  release_handler();
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_EQ(exchange(other, 7), "");
  owner_->set_notification_handler({});
}

// A transfer's on_done runs on the loop that also serves endpoints (one
// loop here): an endpoint destroyed there must not wait for that loop.
TEST_P(ConformanceTest, AnEndpointDestroyedInATransfersCallbackGoesAtOnce) {
  reader_ = make([](Config& c) { c.io_threads = 1; });
  EndpointPair pair = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(pair.receiver && pair.sender);
  Owned source = own(4096, 3);
  ASSERT_TRUE(run_in_a_transfers_callback(*reader_, source.handle, allocate(4096),
                                          [&] { pair.sender.reset(); }));
  // Its peer sees it go.
  LocalMemory message = allocate(64);
  EXPECT_FALSE(pair.receiver->receive(message, kTimeout).ok());
}

// A manager shut down from a transfer's on_done (on its loop's thread):
// its endpoints break, and close without waiting for that loop.
TEST_P(ConformanceTest, AnEndpointOfAManagerShutDownInACallbackBreaksAndCloses) {
  reader_ = make([](Config& c) { c.io_threads = 1; });
  EndpointPair pair = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(pair.receiver && pair.sender);
  Owned source = own(4096, 3);
  ASSERT_TRUE(run_in_a_transfers_callback(*reader_, source.handle, allocate(4096),
                                          [&] { reader_->shutdown(); }));
  LocalMemory message = allocate(64);
  const auto until = Clock::now() + kTimeout;
  Status sent;
  do {  // broken once its loop has let its server go
    sent = pair.sender->send(message, 100ms);
  } while (sent.code() == StatusCode::kDeadlineExceeded && Clock::now() < until);
  EXPECT_EQ(sent.code(), StatusCode::kFailedPrecondition) << sent.to_string();
  pair.sender->close();
  pair.sender.reset();
}

// A notification handler runs in a step of the endpoint's server; the
// endpoint it came from may be destroyed there (a peer's "goodbye" tag),
// and goes once the step ends.
TEST_P(ConformanceTest, ANotificationHandlerMayDestroyItsEndpoint) {
  EndpointPair pair = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(pair.receiver && pair.sender);
  Owned target = own(4096, 0);
  std::promise<void> destroyed;
  owner_->set_notification_handler([&](const Notification&) {
    if (!pair.receiver) return;
    pair.receiver.reset();
    destroyed.set_value();
  });
  ASSERT_TRUE(pair.sender->write(target.handle, with_pattern(4096, 5), 5, kTimeout).ok());
  ASSERT_EQ(destroyed.get_future().wait_for(kTimeout), std::future_status::ready);
  // The peer sees the endpoint go.
  LocalMemory message = allocate(64);
  EXPECT_FALSE(pair.sender->receive(message, kTimeout).ok());
  owner_->set_notification_handler({});
}

}  // namespace
}  // namespace rdmabuf::conformance
