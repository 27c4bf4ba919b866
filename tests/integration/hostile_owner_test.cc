// Faults on the reader's side of the tcp transport: an "owner" that speaks
// the hello correctly and then misbehaves on the data stream (garbage
// replies, absurd lengths, the wrong request id, half a reply and a stall,
// a reset in the middle of a payload, never reading a write's payload).
// Every op ends in an error within its timeout; no byte of a reply that
// comes after wait() returned lands in the destination; the reader manager
// goes on serving a genuine owner; and it does not leak file descriptors.
//
// The hostile owner is a thread of this process on a socket of its own; the
// handles point at it with a genuine handle's id and token (forge.h).
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstring>
#include <thread>

#include "backends/tcp/protocol.h"
#include "common/hello.h"
#include "common/socket.h"
#include "tests/helpers/forge.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

enum class Misbehaviour {
  kGarbageReply,         // 24 bytes of 0xff instead of a response header
  kAbsurdPayload,        // a read answered OK with a payload of 1 TiB
  kWrongRequestId,       // a well-formed answer to a request never sent
  kHalfHeaderThenStall,  // 12 bytes of the response header, then silence
  kHalfPayloadThenLate,  // header and half the payload; the rest after 1.5 s
  kResetMidPayload,      // header and part of the payload, then a TCP reset
  kNeverReads,           // reads the hello and nothing after it
};

const char* name_of(Misbehaviour m) {
  switch (m) {
    case Misbehaviour::kGarbageReply:
      return "garbage reply";
    case Misbehaviour::kAbsurdPayload:
      return "absurd payload length";
    case Misbehaviour::kWrongRequestId:
      return "wrong request id";
    case Misbehaviour::kHalfHeaderThenStall:
      return "half a header, then a stall";
    case Misbehaviour::kHalfPayloadThenLate:
      return "half the payload, the rest late";
    case Misbehaviour::kResetMidPayload:
      return "reset mid-payload";
    case Misbehaviour::kNeverReads:
      return "never reads";
  }
  return "?";
}

constexpr std::byte kLate{0x5a};  // the bytes a late payload carries

// Listens on 127.0.0.1; answers every hello as the manager the caller
// expects, then misbehaves on the data stream. Connections stay open until
// the owner is destroyed (so a stall is a stall, not a close).
class HostileOwner {
 public:
  explicit HostileOwner(Misbehaviour how) : how_(how) {
    auto fd = listen_tcp(HostPort{"127.0.0.1", 0}, 16);
    EXPECT_TRUE(fd.ok()) << fd.status().to_string();
    if (!fd.ok()) return;
    listen_fd_ = std::move(fd).value();
    // accept() blocks; the destructor's shutdown() wakes it.
    set_nonblocking(listen_fd_.get(), false).ignore();
    address_ = local_address(listen_fd_.get())->to_string();
    thread_ = std::thread([this] { serve(); });
  }
  ~HostileOwner() {
    stop_ = true;
    ::shutdown(listen_fd_.get(), SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    for (std::thread& t : connections_)
      t.join();
  }
  const std::string& address() const { return address_; }

 private:
  void serve() {
    while (!stop_) {
      int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      connections_.emplace_back([this, fd] { misbehave(Fd(fd)); });
    }
  }

  // Sleeps until the owner is destroyed.
  void stall() const {
    while (!stop_)
      std::this_thread::sleep_for(10ms);
  }

  void misbehave(Fd fd) {
    const Deadline soon = Clock::now() + 10s;
    set_nonblocking(fd.get(), true).ignore();
    auto hello = read_hello(fd.get(), soon);
    if (!hello.ok()) return;
    if (!send_hello_reply(fd.get(), hello->expected_id, Status::Ok(), soon).ok()) return;
    if (how_ == Misbehaviour::kNeverReads) return stall();
    tcp::RequestHeader request{};
    if (!recv_exact(fd.get(), &request, sizeof request, soon).ok()) return;
    tcp::ResponseHeader reply{};
    reply.kind = request.kind | tcp::kResponseBit;
    reply.request_id = request.request_id;
    reply.payload =
        request.kind == static_cast<uint8_t>(tcp::RequestKind::kRead) ? request.length : 0;
    std::vector<std::byte> payload(reply.payload, kLate);
    auto send = [&](const void* data, size_t size) {
      return send_exact(fd.get(), data, size, soon).ok();
    };
    switch (how_) {
      case Misbehaviour::kGarbageReply: {
        std::array<uint8_t, sizeof reply> garbage;
        garbage.fill(0xff);
        send(garbage.data(), garbage.size());
        return stall();
      }
      case Misbehaviour::kAbsurdPayload:
        reply.payload = uint64_t{1} << 40;
        send(&reply, sizeof reply);
        return stall();
      case Misbehaviour::kWrongRequestId:
        reply.request_id ^= 0x1234;
        send(&reply, sizeof reply);
        return stall();
      case Misbehaviour::kHalfHeaderThenStall:
        send(&reply, sizeof reply / 2);
        return stall();
      case Misbehaviour::kHalfPayloadThenLate:
        if (!send(&reply, sizeof reply) || !send(payload.data(), payload.size() / 2)) return;
        std::this_thread::sleep_for(1500ms);  // past the reader's deadline
        send(payload.data() + payload.size() / 2, payload.size() - payload.size() / 2);
        return stall();
      case Misbehaviour::kResetMidPayload: {
        if (!send(&reply, sizeof reply) || !send(payload.data(), payload.size() / 3)) return;
        linger abort{1, 0};  // close() sends a reset
        ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
        return;
      }
      case Misbehaviour::kNeverReads:
        return;
    }
  }

  const Misbehaviour how_;
  Fd listen_fd_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::thread> connections_;  // touched by thread_ only, joined after it
};

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d))
      ++n;
    ::closedir(d);
  }
  return n;
}

struct Expectation {
  Misbehaviour how;
  bool write;  // the op is a write (else a read)
  // Codes the op may fail with: what the owner did, or the deadline.
  std::vector<StatusCode> codes;
};

class HostileOwnerTest : public ::testing::TestWithParam<Expectation> {};

// Each misbehaviour, three times over with the same reader manager (so a
// connection left in a bad state would show), then a genuine owner. The
// op's timeout is 1 s; it must end within 1 s plus slack, and a payload
// that arrives after wait() returned must not land.
TEST_P(HostileOwnerTest, FailsWithinTheTimeoutAndTheReaderGoesOn) {
  const Expectation& e = GetParam();
  constexpr uint64_t kSize = 1 << 20;
  auto genuine = start_peer({{kSize, 31}});
  ASSERT_NE(genuine, nullptr);
  auto reader = make_manager([](Config& c) { c.tcp_streams = 1; });
  ASSERT_NE(reader, nullptr);
  LocalMemory warm = allocate(kSize);
  ASSERT_TRUE(reader->read_into(genuine->handle(0), warm, kTimeout).ok());
  // Allocated before counting: LocalMemory::allocate's memory holds a
  // descriptor of its file while it lives.
  LocalMemory dst = with_sentinel(kSize);
  const size_t fds_before = open_fds();

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(std::string(name_of(e.how)) + ", round " + std::to_string(round));
    HostileOwner owner(e.how);
    auto handle = with_address(genuine->handle(0), owner.address());
    ASSERT_TRUE(handle.ok()) << handle.status().to_string();
    LocalMemory local = e.write ? with_pattern(kSize, 32) : with_sentinel(kSize);
    Transfer t =
        reader->submit({e.write ? Op::write(*handle, local) : Op::read(*handle, local)}, 1000ms);
    Status s;
    const auto took = timed([&] { s = t.wait(); });
    EXPECT_FALSE(s.ok()) << "the op succeeded against an owner that " << name_of(e.how);
    EXPECT_NE(std::find(e.codes.begin(), e.codes.end(), s.code()), e.codes.end()) << s.to_string();
    EXPECT_LT(took, 3s) << s.to_string();
    if (!e.write) {
      // Whatever the owner sends from now on (kHalfPayloadThenLate sends the
      // rest at 1.5 s) must not reach the destination.
      const std::vector<std::byte> at_return(local.data(), local.data() + local.size());
      std::this_thread::sleep_for(e.how == Misbehaviour::kHalfPayloadThenLate ? 1500ms : 50ms);
      EXPECT_TRUE(std::equal(at_return.begin(), at_return.end(), local.data()))
          << "bytes landed after wait() returned";
    }
  }

  // The reader goes on with a genuine owner, and holds no more descriptors
  // than before, within a little slack: the hostile owners' connections are
  // closed (an idle peer keeps no descriptor; its state is forgotten once
  // 64 peers are known, see ManyShortLivedHostileOwners).
  Status s = reader->read_into(genuine->handle(0), dst, kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(find_mismatch(dst.span(), 31), std::nullopt);
  size_t fds_after = open_fds();
  for (int i = 0; i < 100 && fds_after > fds_before + 3; ++i) {
    std::this_thread::sleep_for(20ms);  // the loops let go as they notice
    fds_after = open_fds();
  }
  EXPECT_LE(fds_after, fds_before + 3) << "file descriptors leaked";
  expect_clean_exit(*genuine);
}

// A reader that meets many short-lived owners that all misbehave keeps a
// bounded number of descriptors: idle peers are forgotten once 64 are known.
TEST(HostileOwnersTest, ManyShortLivedHostileOwnersDoNotAccumulateDescriptors) {
  constexpr uint64_t kSize = 4096;
  auto genuine = start_peer({{kSize, 33}});
  ASSERT_NE(genuine, nullptr);
  auto reader = make_manager([](Config& c) { c.tcp_streams = 1; });
  ASSERT_NE(reader, nullptr);
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(genuine->handle(0), dst, kTimeout).ok());
  const size_t fds_before = open_fds();
  for (int round = 0; round < 150; ++round) {
    HostileOwner owner(Misbehaviour::kGarbageReply);
    auto handle = with_address(genuine->handle(0), owner.address());
    ASSERT_TRUE(handle.ok()) << handle.status().to_string();
    Status s = reader->read_into(*handle, dst, 2000ms);
    ASSERT_FALSE(s.ok()) << "round " << round;
  }
  EXPECT_LE(open_fds(), fds_before + 64 + 4) << "descriptors grow with every owner met";
  ASSERT_TRUE(reader->read_into(genuine->handle(0), dst, kTimeout).ok());
  EXPECT_EQ(find_mismatch(dst.span(), 33), std::nullopt);
  expect_clean_exit(*genuine);
}

using C = StatusCode;
INSTANTIATE_TEST_SUITE_P(
    Misbehaviours, HostileOwnerTest,
    ::testing::Values(
        Expectation{Misbehaviour::kGarbageReply, false, {C::kProtocolError, C::kUnavailable}},
        Expectation{Misbehaviour::kAbsurdPayload, false, {C::kProtocolError, C::kUnavailable}},
        Expectation{Misbehaviour::kWrongRequestId, false, {C::kProtocolError, C::kUnavailable}},
        Expectation{Misbehaviour::kHalfHeaderThenStall, false, {C::kDeadlineExceeded}},
        Expectation{Misbehaviour::kHalfPayloadThenLate, false, {C::kDeadlineExceeded}},
        Expectation{Misbehaviour::kResetMidPayload, false, {C::kUnavailable}},
        Expectation{Misbehaviour::kGarbageReply, true, {C::kProtocolError, C::kUnavailable}},
        Expectation{Misbehaviour::kNeverReads, true, {C::kDeadlineExceeded}}),
    [](const ::testing::TestParamInfo<Expectation>& param) {
      std::string n = name_of(param.param.how);
      std::string out = param.param.write ? "Write_" : "Read_";
      bool upper = true;
      for (char ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) {
          upper = true;
          continue;
        }
        out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
        upper = false;
      }
      return out;
    });

}  // namespace
}  // namespace rdmabuf::testing
