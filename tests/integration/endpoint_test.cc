// Endpoints between real processes: the peer (rdmabuf_test_peer) connects
// to this process's listener and is killed while a message is on its way,
// or while this process waits for it to post a receive. Neither side may
// hang, deliver half a message as a whole one, or keep the memory posted.
#include <signal.h>

#include <future>

#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

struct Connected {
  std::unique_ptr<TestPeer> peer;
  std::unique_ptr<Endpoint> endpoint;
};

// A peer process whose endpoint is connected to one of `manager`.
Connected connect_peer(Manager& manager) {
  Connected c;
  c.peer = start_peer({});
  if (!c.peer) return c;
  auto listener = manager.listen("127.0.0.1:0");
  EXPECT_TRUE(listener.ok()) << listener.status().to_string();
  if (!listener.ok()) return c;
  auto answer = std::async(std::launch::async, [&] {
    return c.peer->command("endpoint-connect " + (*listener)->address());
  });
  auto accepted = (*listener)->accept(kTimeout);
  EXPECT_EQ(answer.get(), "ok");
  EXPECT_TRUE(accepted.ok()) << accepted.status().to_string();
  if (accepted.ok()) c.endpoint = std::move(accepted).value();
  return c;
}

// The peer is killed while its message (large enough to be written, not
// inlined) is on its way: the receive ends on time, with the whole message
// or with kUnavailable, and its memory is no longer registered.
TEST(EndpointTest, PeerKilledWithAMessageInFlight) {
  auto manager = make_manager();
  ASSERT_NE(manager, nullptr);
  auto [peer, endpoint] = connect_peer(*manager);
  ASSERT_TRUE(peer && endpoint);
  constexpr uint64_t kSize = 256 << 20;
  LocalMemory into = allocate(kSize);
  const size_t registered = manager->registered_count();
  auto receiving = std::async(
      std::launch::async, [&, &endpoint = endpoint] { return endpoint->receive(into, kTimeout); });
  ASSERT_EQ(peer->command("endpoint-send " + std::to_string(kSize) + " 21"), "started");
  std::this_thread::sleep_for(20ms);
  const auto killed_at = Clock::now();
  peer->process().signal(SIGKILL);
  ASSERT_EQ(receiving.wait_for(kTimeout + 10s), std::future_status::ready) << "receive hangs";
  auto received = receiving.get();
  EXPECT_LT(Clock::now() - killed_at, 10s) << "the receive waited for its timeout";
  if (received.ok()) {
    EXPECT_EQ(*received, kSize);
    EXPECT_EQ(find_mismatch(into.span(), 21), std::nullopt) << "a whole message, or none";
  } else {
    EXPECT_EQ(received.status().code(), StatusCode::kUnavailable) << received.status().to_string();
  }
  EXPECT_EQ(manager->registered_count(), registered);
  EXPECT_EQ(endpoint->receive(allocate(8), kTimeout).status().code(), StatusCode::kUnavailable);
}

// This side sends, the peer never posts a receive and is killed: the send
// fails at once with kUnavailable, not at its timeout.
TEST(EndpointTest, PeerKilledWhileASendWaitsForItsReceive) {
  auto manager = make_manager();
  ASSERT_NE(manager, nullptr);
  auto [peer, endpoint] = connect_peer(*manager);
  ASSERT_TRUE(peer && endpoint);
  auto sending = std::async(std::launch::async, [&, &endpoint = endpoint] {
    return endpoint->send(with_pattern(1 << 20, 3), kTimeout);
  });
  std::this_thread::sleep_for(100ms);
  const auto killed_at = Clock::now();
  peer->process().signal(SIGKILL);
  ASSERT_EQ(sending.wait_for(kTimeout + 10s), std::future_status::ready) << "send hangs";
  Status st = sending.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_LT(Clock::now() - killed_at, 5s);
}

// A peer that exits cleanly with a send still waiting for a receive: the
// endpoint closes, and both ends see it.
TEST(EndpointTest, PeerThatExitsEndsItsEndpoint) {
  auto manager = make_manager();
  ASSERT_NE(manager, nullptr);
  auto [peer, endpoint] = connect_peer(*manager);
  ASSERT_TRUE(peer && endpoint);
  ASSERT_EQ(peer->command("endpoint-send 4096 5"), "started");
  LocalMemory into = allocate(4096);
  auto got = endpoint->receive(into, kTimeout);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(find_mismatch(into.span(), 5), std::nullopt);
  expect_clean_exit(*peer);
  EXPECT_EQ(endpoint->receive(allocate(8), kTimeout).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace rdmabuf::testing
