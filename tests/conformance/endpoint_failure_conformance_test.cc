// The conformance suite, how an endpoint's calls fail: the endpoint closed
// by either side, a message too large, a peer that is no endpoint; each
// backend in turn (fixture.h).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/socket.h"
#include "rdmabuf/rdmabuf.h"
#include "tests/conformance/endpoint_pair.h"
#include "tests/conformance/fixture.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/printers.h"

namespace rdmabuf::conformance {
namespace {

TEST_P(ConformanceTest, EndpointPostedReceiveFailsWhenTheEndpointCloses) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  LocalMemory into = with_sentinel(65536);
  auto posted = receiver->post_receive(into);
  ASSERT_TRUE(posted.ok()) << posted.status().to_string();
  receiver->close();
  EXPECT_EQ(posted->wait(kTimeout).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(receiver->post_receive(into).status().code(), StatusCode::kCancelled);
}

TEST_P(ConformanceTest, EndpointOversizeMessageFailsBothSidesAndTruncatesNothing) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  LocalMemory into = with_sentinel(100);
  auto receiving = std::async(
      std::launch::async, [&, &receiver = receiver] { return receiver->receive(into, kTimeout); });
  Status st = sender->send(with_pattern(101, 3), kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  auto received = receiving.get();
  EXPECT_EQ(received.status().code(), StatusCode::kInvalidArgument)
      << received.status().to_string();
  EXPECT_FALSE(find_not(bytes(into).span(), kSentinel))
      << "a refused message wrote into the receive";
  // The endpoint goes on: the next message that fits arrives.
  auto next = std::async(std::launch::async, [&, &receiver = receiver] {
    LocalMemory bigger = with_sentinel(200);
    auto size = receiver->receive(bigger, kTimeout);
    return size.ok() && *size == 101 && !find_mismatch(bytes(bigger).span().first(101), 3);
  });
  EXPECT_TRUE(sender->send(with_pattern(101, 3), kTimeout).ok());
  EXPECT_TRUE(next.get());
}

TEST_P(ConformanceTest, EndpointClosedByThePeerFailsWaitingCalls) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  auto receiving = std::async(std::launch::async, [&, &receiver = receiver] {
    LocalMemory into = allocate(64);
    return receiver->receive(into, kTimeout).status();
  });
  std::this_thread::sleep_for(50ms);
  const auto start = Clock::now();
  sender.reset();  // closes it
  Status st = receiving.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(receiver->send(with_pattern(8, 1), kTimeout).code(), StatusCode::kUnavailable);
  EXPECT_EQ(receiver->receive(allocate(8), kTimeout).status().code(), StatusCode::kUnavailable);
}

TEST_P(ConformanceTest, EndpointRefusesWhatIsNotAnEndpoint) {
  auto listener = owner_->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  auto where = parse_host_port((*listener)->address());
  ASSERT_TRUE(where.ok());
  // A client that sends junk instead of the greeting is dropped, and
  // accept() takes the endpoint that connected behind it.
  auto junk = connect_tcp(*where, Clock::now() + kTimeout);
  ASSERT_TRUE(junk.ok()) << junk.status().to_string();
  const char bytes[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_TRUE(send_exact(junk->get(), bytes, sizeof bytes, Clock::now() + kTimeout).ok());
  auto connecting = std::async(std::launch::async,
                               [&] { return reader_->connect((*listener)->address(), kTimeout); });
  auto accepted = (*listener)->accept(kTimeout);
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
  EXPECT_TRUE(connecting.get().ok());
  // The junk client's connection was closed: it reads to its end.
  char drained[256];
  ssize_t n = 1;
  while (n > 0 && wait_fd(junk->get(), POLLIN, Clock::now() + kTimeout).ok()) {
    n = ::recv(junk->get(), drained, sizeof drained, 0);
  }
  EXPECT_LE(n, 0) << "the listener kept the junk client's connection";
  // And connect() to a manager's own listener, which speaks another protocol.
  auto connected = reader_->connect(owner_->address(), 1s);
  EXPECT_FALSE(connected.ok());
  EXPECT_EQ(owner_->connect("no-colon", kTimeout).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rdmabuf::conformance
