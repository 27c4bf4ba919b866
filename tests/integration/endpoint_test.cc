// Endpoints between real processes: the peer (rdmabuf_test_peer) connects
// to this process's listener and is killed while a message is on its way,
// or while this process waits for it to post a receive. Neither side may
// hang, deliver half a message as a whole one, or keep the memory posted.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <optional>
#include <span>
#include <vector>

#include "common/socket.h"
#include "tests/helpers/raw_endpoint.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

struct Connected {
  std::unique_ptr<TestPeer> peer;
  std::unique_ptr<Endpoint> endpoint;
};

// This process's manager for an endpoint whose frames travel through
// `channel`: "tcp", or "shm" (shared memory; the peer process may use
// every backend). Skips, saying why, when shared memory is not viable.
std::unique_ptr<Manager> make_manager_for(const std::string& channel) {
  return make_manager([&](Config& c) {
    if (channel == "shm") c.backends = {"memory", "tcp"};
  });
}

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

class EndpointTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A manager and a peer process connected over the channel of the
  // parameter; false (skipped, with the reason) when it is not viable here.
  bool connect() {
    manager_ = make_manager_for(GetParam());
    if (!manager_) return false;
    connected_ = connect_peer(*manager_);
    if (!connected_.peer || !connected_.endpoint) return false;
    if (GetParam() == "shm" && connected_.endpoint->channel() != "shared memory") {
      skip_reason_ =
          "frames do not travel through shared memory here: " + connected_.endpoint->channel();
      return false;
    }
    return true;
  }
  std::unique_ptr<Manager> manager_;
  Connected connected_;
  std::string skip_reason_;
};

#define CONNECT_OR_SKIP()                                    \
  if (!connect()) {                                          \
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_; \
    FAIL() << "could not connect an endpoint to a peer";     \
  }                                                          \
  Manager* manager = manager_.get();                         \
  auto& peer = connected_.peer;                              \
  auto& endpoint = connected_.endpoint;                      \
  (void)manager, (void)peer

// The peer is killed while its message (large enough to be written, not
// inlined) is on its way: the receive ends on time, with the whole message
// or with kUnavailable, and its memory is no longer registered.
TEST_P(EndpointTest, PeerKilledWithAMessageInFlight) {
  CONNECT_OR_SKIP();
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
TEST_P(EndpointTest, PeerKilledWhileASendWaitsForItsReceive) {
  CONNECT_OR_SKIP();
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
TEST_P(EndpointTest, PeerThatExitsEndsItsEndpoint) {
  CONNECT_OR_SKIP();
  ASSERT_EQ(peer->command("endpoint-send 4096 5"), "started");
  LocalMemory into = allocate(4096);
  auto got = endpoint->receive(into, kTimeout);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(find_mismatch(into.span(), 5), std::nullopt);
  expect_clean_exit(*peer);
  EXPECT_EQ(endpoint->receive(allocate(8), kTimeout).status().code(), StatusCode::kUnavailable);
}

// This process's descriptor of the rings an endpoint shares with its peer
// (a memfd named "rdmabuf-endpoint"), or -1.
int find_endpoint_rings() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = ::readdir(dir)) {
    std::string link = "/proc/self/fd/" + std::string(entry->d_name);
    char target[256] = {};
    if (::readlink(link.c_str(), target, sizeof target - 1) <= 0) continue;
    if (std::string(target).rfind("/memfd:rdmabuf-endpoint", 0) == 0)
      found = std::atoi(entry->d_name);
  }
  ::closedir(dir);
  return found;
}

// A peer that scribbles over the shared rings (here: a record header with
// a mark that no writer stores, where its next record would go) is cut off
// with kProtocolError; nothing is read out of bounds.
// The rings of the endpoint in this process, mapped anew, as a peer that
// shares them may write them (the layout of docs/wire-format.md: a page
// holding magic, nonce, ring size and the ring controls, then ring 0,
// written by the connecting side, then ring 1).
class ForgedRings {
 public:
  static constexpr size_t kPage = 4096;
  static constexpr size_t kRing = 2048u << 10;

  // Maps the rings of the one endpoint this process has (mapped() says
  // whether it found them).
  ForgedRings() {
    const int fd = find_endpoint_rings();
    if (fd < 0) return;
    base_ = ::mmap(nullptr, kPage + 2 * kRing, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ~ForgedRings() {
    if (base_ != MAP_FAILED) ::munmap(base_, kPage + 2 * kRing);
  }
  bool mapped() const { return base_ != MAP_FAILED; }
  uint64_t ring_size() const { return static_cast<const uint64_t*>(base_)[2]; }

  // Where the connecting side (the peer, idle now) writes its next record
  // in ring 0, after its records so far (the handshake's frames, if any):
  // each a header word (length, mark "REC1"), its bytes, and the next on
  // the next 64-byte line. The word there is zero.
  size_t next_record() {
    size_t at = 0;
    for (uint64_t word; (word = header(at).load()) != 0;) {
      EXPECT_EQ(word >> 32, 0x52454331u) << "a record's header at " << at;
      at = (at + 8 + (word & 0xffffffff) + 63) & ~size_t{63};
      if (at >= kRing) {
        ADD_FAILURE() << "no end of the records in ring 0";
        return 0;
      }
    }
    return at;
  }
  // A record of `bytes` at `at`, the bytes first, then its header.
  void write_record(size_t at, std::span<const uint8_t> bytes) {
    std::memcpy(ring0() + at + 8, bytes.data(), bytes.size());
    header(at).store(uint64_t{0x52454331} << 32 | bytes.size());
  }
  std::atomic_ref<uint64_t> header(size_t at) {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(ring0() + at));
  }

 private:
  uint8_t* ring0() { return static_cast<uint8_t*>(base_) + kPage; }
  void* base_ = MAP_FAILED;
};

TEST_P(EndpointTest, PeerThatCorruptsTheSharedRingsIsCutOff) {
  if (GetParam() != "shm") GTEST_SKIP() << "frames travel through TCP: there are no rings";
  CONNECT_OR_SKIP();
  ForgedRings rings;
  ASSERT_TRUE(rings.mapped()) << "no memfd:rdmabuf-endpoint among this process's descriptors";
  ASSERT_EQ(rings.ring_size(), ForgedRings::kRing) << "ring size where the layout says";
  rings.header(rings.next_record()).store(uint64_t{0x0badbeef} << 32 | 5);
  auto received = endpoint->receive(allocate(4096), kTimeout);
  EXPECT_EQ(received.status().code(), StatusCode::kProtocolError) << received.status().to_string();
}

// A receive's credit (kPosted: seq, capacity, a u16 handle length, the
// handle) is taken from the ring where it lies when it has no handle; one
// whose length says a handle follows that the frame does not hold is
// malformed all the same.
TEST_P(EndpointTest, PeerWhoseCreditClaimsAHandleItDoesNotCarryIsCutOff) {
  if (GetParam() != "shm") GTEST_SKIP() << "frames travel through TCP: there are no rings";
  CONNECT_OR_SKIP();
  ForgedRings rings;
  ASSERT_TRUE(rings.mapped()) << "no memfd:rdmabuf-endpoint among this process's descriptors";
  std::vector<uint8_t> credit;
  auto put = [&credit](auto value) {  // little-endian, as the wire
    const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
    credit.insert(credit.end(), bytes, bytes + sizeof value);
  };
  put(uint32_t{18});  // the frame's header: payload size, then type kPosted (2)
  put(uint8_t{2});
  put(uint64_t{0});     // seq
  put(uint64_t{4096});  // capacity
  put(uint16_t{5});     // a handle of 5 bytes, which the frame's size leaves no room for
  rings.write_record(rings.next_record(), credit);
  auto received = endpoint->receive(allocate(4096), kTimeout);
  EXPECT_EQ(received.status().code(), StatusCode::kProtocolError) << received.status().to_string();
  EXPECT_NE(received.status().message().find("credit"), std::string::npos)
      << received.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Channels, EndpointTest, ::testing::Values("tcp", "shm"),
                         [](const ::testing::TestParamInfo<std::string>& channel) {
                           return channel.param;
                         });

// --- The listener ----------------------------------------------------------------

// close() from another thread wakes an accept that waits for a connection,
// or for the greeting of one that connected and says nothing; afterwards
// connects are refused and accept fails at once.
TEST(EndpointListenerTest, CloseWakesAWaitingAcceptAndRefusesLaterConnects) {
  auto manager = make_manager();
  ASSERT_TRUE(manager);
  for (bool silent_client : {false, true}) {
    SCOPED_TRACE(silent_client ? "accept waits for a greeting" : "accept waits for a connection");
    auto listener = manager->listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status().to_string();
    auto where = parse_host_port((*listener)->address());
    ASSERT_TRUE(where.ok());
    std::optional<Fd> silent;
    if (silent_client) {
      auto fd = connect_tcp(*where, Clock::now() + kTimeout);
      ASSERT_TRUE(fd.ok()) << fd.status().to_string();
      silent = std::move(fd).value();
    }
    const auto start = Clock::now();
    auto accepting = std::async(std::launch::async, [&] { return (*listener)->accept(60s); });
    EXPECT_EQ(accepting.wait_for(200ms), std::future_status::timeout) << "accept did not wait";
    (*listener)->close();
    ASSERT_EQ(accepting.wait_for(5s), std::future_status::ready) << "close did not wake accept";
    EXPECT_EQ(accepting.get().status().code(), StatusCode::kCancelled);
    EXPECT_LT(Clock::now() - start, 5s);
    EXPECT_FALSE(connect_tcp(*where, Clock::now() + 2s).ok()) << "a closed listener took a connect";
    EXPECT_EQ((*listener)->accept(1s).status().code(), StatusCode::kCancelled);
    (*listener)->close();  // idempotent
  }
}

// A peer slower to greet than the caller's accept timeout is not refused:
// an accept that times out between two of its frames keeps its handshake
// for the next, and the accept after its last frame returns it, well
// before the handshake's own limit (5 s), and not held up by a silent
// connection in front of it.
TEST(EndpointListenerTest, AHandshakeSpreadOverShortAcceptsIsKeptUntilItCompletes) {
  auto manager = make_manager();
  ASSERT_TRUE(manager);
  auto listener = manager->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  auto where = parse_host_port((*listener)->address());
  ASSERT_TRUE(where.ok());
  auto silent = connect_tcp(*where, Clock::now() + kTimeout);
  ASSERT_TRUE(silent.ok()) << silent.status().to_string();
  auto peer = RawEndpointPeer::connect((*listener)->address());
  ASSERT_TRUE(peer);
  // Its hello after 300 ms, its channel offer (no shared memory) 300 ms later.
  auto slow_peer = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);
    if (!peer->send_hello(77)) return false;
    std::this_thread::sleep_for(300ms);
    return peer->send_offer();
  });
  const auto start = Clock::now();
  int timed_out = 0;
  Result<std::unique_ptr<Endpoint>> accepted = DeadlineExceeded("no accept yet");
  while (Clock::now() - start < 10s) {
    accepted = (*listener)->accept(50ms);
    if (accepted.status().code() != StatusCode::kDeadlineExceeded) break;
    ++timed_out;
  }
  EXPECT_TRUE(slow_peer.get());
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
  EXPECT_LT(Clock::now() - start, 4s) << "held to the handshake's limit";
  EXPECT_GE(timed_out, 4) << "the handshake did not span several accepts";
  // The peer got the listener's hello, once, and its answer to the offer.
  EXPECT_TRUE(peer->finish(kTimeout)) << "the listener's hello or channel answer was wrong";
}

// Connections that fail the handshake (one speaks something else, one goes
// away, one says nothing) are dropped, and accept() waits on: it returns
// the well-behaved peer that connected behind them at once, not held up by
// the silent one, which a later accept drops at its handshake limit (5 s).
TEST(EndpointListenerTest, ConnectionsThatFailTheHandshakeAreDroppedAndThePeerBehindAccepted) {
  auto manager = make_manager();
  auto other = make_manager();
  ASSERT_TRUE(manager && other);
  auto listener = manager->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  auto where = parse_host_port((*listener)->address());
  ASSERT_TRUE(where.ok());
  auto garbage = connect_tcp(*where, Clock::now() + kTimeout);
  ASSERT_TRUE(garbage.ok()) << garbage.status().to_string();
  const std::string not_a_hello(64, 'x');
  ASSERT_EQ(::send(garbage->get(), not_a_hello.data(), not_a_hello.size(), MSG_NOSIGNAL), 64);
  auto gone = connect_tcp(*where, Clock::now() + kTimeout);
  ASSERT_TRUE(gone.ok()) << gone.status().to_string();
  gone->reset();
  auto silent = connect_tcp(*where, Clock::now() + kTimeout);
  ASSERT_TRUE(silent.ok()) << silent.status().to_string();
  auto connecting =
      std::async(std::launch::async, [&] { return other->connect((*listener)->address(), 60s); });
  const auto start = Clock::now();
  auto accepted = (*listener)->accept(60s);
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
  EXPECT_LT(Clock::now() - start, 3s) << "the silent client held up the peer behind it";
  auto connected = connecting.get();
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  // And the two talk.
  LocalMemory message = with_pattern(8, 3);
  auto sending =
      std::async(std::launch::async, [&] { return (*connected)->send(message, kTimeout); });
  LocalMemory into = allocate(8);
  auto got = (*accepted)->receive(into, kTimeout);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, 8u);
  EXPECT_EQ(std::memcmp(into.data(), message.data(), 8), 0);
  EXPECT_TRUE(sending.get().ok());
  // The silent one is dropped (its connection closed) by the next accept,
  // at its limit, while that accept waits on.
  auto dropping = std::async(std::launch::async, [&] { return (*listener)->accept(6s); });
  const Deadline until = Clock::now() + 6s;
  size_t came = 0;  // the listener's hello, then the end
  bool ended = false;
  while (!ended && wait_fd(silent->get(), POLLIN, until).ok()) {
    uint8_t bytes[64];
    const ssize_t n = ::recv(silent->get(), bytes, sizeof bytes, MSG_DONTWAIT);
    if (n > 0) came += static_cast<size_t>(n);
    ended = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
  }
  EXPECT_TRUE(ended) << "the silent connection was not dropped";
  EXPECT_EQ(came, 5u + 22u) << "not just the listener's hello";
  EXPECT_EQ(dropping.get().status().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace rdmabuf::testing
