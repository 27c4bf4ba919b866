// The tcp backend's owner side, spoken to by a hand-written client: a real
// Manager must answer well-formed requests exactly as the protocol says
// (backends/tcp/protocol.h, common/hello.h), drop connections that break it,
// and keep serving everybody else correctly.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "backends/tcp/protocol.h"
#include "common/hello.h"
#include "common/socket.h"
#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/forge.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/printers.h"
#include "tests/helpers/raw_tcp.h"
#include "tests/helpers/sanitizer.h"

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;
using tcp::RequestHeader;
using tcp::RequestKind;
using tcp::ResponseHeader;
using testing::fill_pattern;
using testing::find_mismatch;

constexpr uint64_t kSeed = 77;
constexpr size_t kBufferSize = 1 << 20;
constexpr auto kStall = 300ms;

// A blocking client socket with timeouts on every read.
class RawConnection {
 public:
  explicit RawConnection(const std::string& address) {
    auto where = parse_host_port(address);
    EXPECT_TRUE(where.ok());
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(where->port);
    ::inet_pton(AF_INET, where->host.c_str(), &sin.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0;
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  bool send_all(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (size > 0) {
      ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }
  bool send_all(const std::vector<uint8_t>& bytes) { return send_all(bytes.data(), bytes.size()); }

  // Exactly `size` bytes within `timeout`; false on timeout or close.
  bool recv_exact(void* data, size_t size, std::chrono::milliseconds timeout = 10s) {
    auto deadline = Clock::now() + timeout;
    auto* p = static_cast<uint8_t*>(data);
    while (size > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      ssize_t n = ::recv(fd_, p, size, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  // True when the other end closes (EOF or reset) within `timeout`; bytes
  // that arrive before that are discarded.
  bool closed_within(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    std::vector<uint8_t> sink(1 << 16);
    while (Clock::now() < deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count()) + 1) <= 0) continue;
      ssize_t n = ::recv(fd_, sink.data(), sink.size(), 0);
      if (n == 0) return true;
      if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
    }
    return false;
  }

  // Sends a hello; returns the reply's status code and message.
  std::optional<std::pair<uint8_t, std::string>> hello(uint8_t channel, uint64_t expected = 0,
                                                       uint16_t version = kProtocolVersion,
                                                       const char* magic = "RBHI",
                                                       uint8_t reserved = 0) {
    std::vector<uint8_t> h(24, 0);
    std::memcpy(h.data(), magic, 4);
    std::memcpy(h.data() + 4, &version, 2);
    h[6] = channel;
    h[7] = reserved;
    uint64_t caller = 0x1234;
    std::memcpy(h.data() + 8, &caller, 8);
    std::memcpy(h.data() + 16, &expected, 8);
    if (!send_all(h)) return std::nullopt;
    return read_hello_reply();
  }

  std::optional<std::pair<uint8_t, std::string>> read_hello_reply() {
    uint8_t reply[24];
    if (!recv_exact(reply, sizeof reply)) return std::nullopt;
    EXPECT_EQ(std::memcmp(reply, "RBOK", 4), 0);
    uint16_t version;
    std::memcpy(&version, reply + 4, 2);
    EXPECT_EQ(version, kProtocolVersion);
    EXPECT_EQ(reply[7], 0);
    uint32_t msg_len;
    std::memcpy(&msg_len, reply + 16, 4);
    EXPECT_LE(msg_len, 1024u);
    std::string msg(msg_len, '\0');
    if (msg_len > 0 && !recv_exact(msg.data(), msg_len)) return std::nullopt;
    return std::make_pair(reply[6], msg);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

LocalMemory allocate_or_die(size_t size) {
  auto m = LocalMemory::allocate(size);
  EXPECT_TRUE(m.ok());
  return m.ok() ? *m : LocalMemory();
}

RequestHeader request(RequestKind kind, uint64_t id, const RemoteBuffer& handle, uint64_t offset,
                      uint64_t length) {
  return testing::request_on(handle, kind, id, offset, length);
}

std::vector<uint8_t> bytes_of(const RequestHeader& h) {
  std::vector<uint8_t> out(sizeof h);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

class TcpProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Config config;
    config.backends = {"tcp"};
    config.io_stall_timeout = kStall;
    auto owner = Manager::create(config);
    ASSERT_TRUE(owner.ok()) << owner.status().to_string();
    owner_ = std::move(owner).value();
    auto mem = LocalMemory::allocate(kBufferSize);
    ASSERT_TRUE(mem.ok());
    memory_ = *mem;
    fill_pattern(memory_.span(), kSeed);
    auto handle = owner_->register_buffer(memory_);
    ASSERT_TRUE(handle.ok()) << handle.status().to_string();
    handle_ = *handle;

    Config reader_config;
    reader_config.backends = {"tcp"};
    auto reader = Manager::create(reader_config);
    ASSERT_TRUE(reader.ok()) << reader.status().to_string();
    reader_ = std::move(reader).value();
  }

  // A connection past a successful data-channel hello.
  std::unique_ptr<RawConnection> data_connection() {
    auto c = std::make_unique<RawConnection>(owner_->address());
    EXPECT_TRUE(c->connected());
    auto reply = c->hello(static_cast<uint8_t>(Channel::kTcpData));
    EXPECT_TRUE(reply.has_value());
    if (reply) {
      EXPECT_EQ(reply->first, 0) << reply->second;
    }
    return c;
  }

  // A normal reader, through the library, still gets correct data.
  void expect_reader_works() {
    auto dst = LocalMemory::allocate(kBufferSize);
    ASSERT_TRUE(dst.ok());
    Status s = reader_->read_into(handle_, *dst, 30s);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(find_mismatch(dst->span(), kSeed), std::nullopt);
  }

  // Reads one response header and, for a successful read, its payload.
  void expect_read_reply(RawConnection& c, uint64_t id, uint64_t offset, uint64_t length) {
    ResponseHeader r{};
    ASSERT_TRUE(c.recv_exact(&r, sizeof r));
    EXPECT_EQ(r.kind, static_cast<uint8_t>(RequestKind::kRead) | tcp::kResponseBit);
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.request_id, id);
    ASSERT_EQ(r.payload, length);
    std::vector<std::byte> payload(length);
    ASSERT_TRUE(c.recv_exact(payload.data(), length));
    EXPECT_EQ(find_mismatch(payload, kSeed, offset), std::nullopt);
  }

  void expect_error_reply(RawConnection& c, RequestKind kind, uint64_t id, StatusCode code) {
    ResponseHeader r{};
    ASSERT_TRUE(c.recv_exact(&r, sizeof r));
    EXPECT_EQ(r.kind, static_cast<uint8_t>(kind) | tcp::kResponseBit);
    EXPECT_EQ(r.status, static_cast<uint8_t>(code));
    EXPECT_EQ(r.request_id, id);
    EXPECT_EQ(r.payload, 0u);
  }

  // The buffer can be released without the abort that release() uses on
  // stalled holders (no pin leaked by a dropped connection; a leaked pin
  // would make release wait for ever), and reads through the old handle
  // then fail with NotFound.
  void expect_release_is_prompt() {
    auto release = std::async(std::launch::async, [&] { return owner_->release(handle_); });
    ASSERT_EQ(release.wait_for(5s), std::future_status::ready) << "release hangs: a pin leaked";
    Status s = release.get();
    EXPECT_TRUE(s.ok()) << s.to_string();
    auto dst = LocalMemory::allocate(16);
    ASSERT_TRUE(dst.ok());
    auto slice = handle_.slice(0, 16);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(reader_->read_into(*slice, *dst, 30s).code(), StatusCode::kNotFound);
  }

  std::unique_ptr<Manager> owner_;
  std::unique_ptr<Manager> reader_;
  LocalMemory memory_;
  RemoteBuffer handle_;
};

TEST_F(TcpProtocolTest, ValidReadIsAnsweredInFull) {
  auto c = data_connection();
  ASSERT_TRUE(c->send_all(bytes_of(request(RequestKind::kRead, 1, handle_, 100, 5000))));
  expect_read_reply(*c, 1, 100, 5000);
  // A large read (sent straight from the registered memory) and the last byte.
  ASSERT_TRUE(c->send_all(bytes_of(request(RequestKind::kRead, 2, handle_, 3, kBufferSize - 3))));
  expect_read_reply(*c, 2, 3, kBufferSize - 3);
  ASSERT_TRUE(c->send_all(bytes_of(request(RequestKind::kRead, 3, handle_, kBufferSize - 1, 1))));
  expect_read_reply(*c, 3, kBufferSize - 1, 1);
}

TEST_F(TcpProtocolTest, PipelinedRequestsAreAnsweredInOrder) {
  auto c = data_connection();
  std::vector<uint8_t> batch;
  for (uint64_t i = 0; i < 200; ++i) {
    auto b = bytes_of(request(RequestKind::kRead, 1000 + i, handle_, i * 97, 1 + i * 131));
    batch.insert(batch.end(), b.begin(), b.end());
  }
  ASSERT_TRUE(c->send_all(batch));
  for (uint64_t i = 0; i < 200; ++i)
    expect_read_reply(*c, 1000 + i, i * 97, 1 + i * 131);
}

// Caught by fuzz_tcp_server's model of the owner: a large read (its
// payload sent straight from the registered memory, after the batch is
// processed) followed, in the same batch, by a write to the same bytes
// used to return the written bytes: the owner had reordered the write
// before the read.
TEST_F(TcpProtocolTest, ReadIsAnsweredWithTheBytesBeforeALaterWrite) {
  auto c = data_connection();
  std::vector<uint8_t> batch = bytes_of(request(RequestKind::kRead, 1, handle_, 0, 20000));
  auto write = bytes_of(request(RequestKind::kWrite, 2, handle_, 0, 8));
  batch.insert(batch.end(), write.begin(), write.end());
  batch.insert(batch.end(), 8, 0xee);
  ASSERT_TRUE(c->send_all(batch));  // one send: the owner takes both in one batch
  expect_read_reply(*c, 1, 0, 20000);
  ResponseHeader r{};
  ASSERT_TRUE(c->recv_exact(&r, sizeof r));
  EXPECT_EQ(r.kind, static_cast<uint8_t>(RequestKind::kWrite) | tcp::kResponseBit);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.request_id, 2u);
  testing::ScopedIgnoreReads quiet;
  EXPECT_EQ(memory_.span()[7], std::byte{0xee});
}

TEST_F(TcpProtocolTest, ValidWriteLands) {
  auto c = data_connection();
  std::vector<std::byte> payload(70000);
  fill_pattern(payload, 5, 0);
  auto h = request(RequestKind::kWrite, 9, handle_, 1001, payload.size());
  std::vector<uint8_t> frame = bytes_of(h);
  frame.insert(frame.end(), reinterpret_cast<uint8_t*>(payload.data()),
               reinterpret_cast<uint8_t*>(payload.data()) + payload.size());
  ASSERT_TRUE(c->send_all(frame));
  ResponseHeader r{};
  ASSERT_TRUE(c->recv_exact(&r, sizeof r));
  EXPECT_EQ(r.kind, static_cast<uint8_t>(RequestKind::kWrite) | tcp::kResponseBit);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.request_id, 9u);
  EXPECT_EQ(r.payload, 0u);
  testing::ScopedIgnoreReads quiet;
  EXPECT_EQ(find_mismatch(memory_.span().subspan(1001, payload.size()), 5), std::nullopt);
  EXPECT_EQ(find_mismatch(memory_.span().subspan(0, 1001), kSeed), std::nullopt);
  EXPECT_EQ(
      find_mismatch(memory_.span().subspan(1001 + payload.size()), kSeed, 1001 + payload.size()),
      std::nullopt);
}

TEST_F(TcpProtocolTest, RefusedRequestsGetErrorRepliesAndTheConnectionGoesOn) {
  auto c = data_connection();
  auto wrong_token = request(RequestKind::kRead, 1, handle_, 0, 10);
  wrong_token.token[3] ^= 1;
  auto unknown_id = request(RequestKind::kRead, 2, handle_, 0, 10);
  unknown_id.buffer_id = handle_.id() + 1000;
  auto out_of_bounds = request(RequestKind::kRead, 3, handle_, kBufferSize - 5, 6);
  auto overflow = request(RequestKind::kRead, 4, handle_, ~uint64_t{0} - 5, 10);
  // A handle forged to claim a larger (or smaller) buffer: refused even for
  // a range that lies within the real buffer.
  auto claims_larger = request(RequestKind::kRead, 5, handle_, 0, 10);
  claims_larger.region_size = kBufferSize * 2;
  auto claims_smaller = request(RequestKind::kRead, 6, handle_, 0, 10);
  claims_smaller.region_size = 10;
  std::vector<uint8_t> batch;
  for (const auto& h :
       {wrong_token, unknown_id, out_of_bounds, overflow, claims_larger, claims_smaller}) {
    auto b = bytes_of(h);
    batch.insert(batch.end(), b.begin(), b.end());
  }
  ASSERT_TRUE(c->send_all(batch));
  expect_error_reply(*c, RequestKind::kRead, 1, StatusCode::kPermissionDenied);
  expect_error_reply(*c, RequestKind::kRead, 2, StatusCode::kNotFound);
  expect_error_reply(*c, RequestKind::kRead, 3, StatusCode::kInvalidArgument);
  expect_error_reply(*c, RequestKind::kRead, 4, StatusCode::kInvalidArgument);
  expect_error_reply(*c, RequestKind::kRead, 5, StatusCode::kInvalidArgument);
  expect_error_reply(*c, RequestKind::kRead, 6, StatusCode::kInvalidArgument);
  // Still framed and served.
  ASSERT_TRUE(c->send_all(bytes_of(request(RequestKind::kRead, 7, handle_, 0, 64))));
  expect_read_reply(*c, 7, 0, 64);
}

TEST_F(TcpProtocolTest, RefusedWritePayloadIsDiscardedNotApplied) {
  auto c = data_connection();
  std::vector<uint8_t> junk(200000, 0xee);  // larger than the server's rx buffer
  for (auto mutate : {0, 1, 2, 3}) {
    auto h =
        request(RequestKind::kWrite, 10 + static_cast<uint64_t>(mutate), handle_, 0, junk.size());
    StatusCode expected = StatusCode::kPermissionDenied;
    if (mutate == 0) h.token[0] ^= 0xff;
    if (mutate == 1) {
      h.buffer_id += 999;
      expected = StatusCode::kNotFound;
    }
    if (mutate == 2) {
      h.offset = kBufferSize - junk.size() + 1;
      expected = StatusCode::kInvalidArgument;
    }
    if (mutate == 3) {
      h.region_size = kBufferSize + 1;  // in bounds, but the claimed size is wrong
      expected = StatusCode::kInvalidArgument;
    }
    ASSERT_TRUE(c->send_all(bytes_of(h)));
    ASSERT_TRUE(c->send_all(junk));
    expect_error_reply(*c, RequestKind::kWrite, 10 + static_cast<uint64_t>(mutate), expected);
  }
  ASSERT_TRUE(c->send_all(bytes_of(request(RequestKind::kRead, 20, handle_, 0, kBufferSize))));
  expect_read_reply(*c, 20, 0, kBufferSize);
  testing::ScopedIgnoreReads quiet;
  EXPECT_EQ(find_mismatch(memory_.span(), kSeed), std::nullopt) << "a refused write landed";
}

struct BadHello {
  const char* what;
  const char* magic;
  uint16_t version;
  uint8_t channel;
  uint8_t reserved;
  StatusCode expected;
};

TEST_F(TcpProtocolTest, BadHellosAreAnsweredAndClosed) {
  const uint8_t data = static_cast<uint8_t>(Channel::kTcpData);
  const BadHello cases[] = {
      {"wrong magic", "HTTP", kProtocolVersion, data, 0, StatusCode::kProtocolError},
      {"version 0", "RBHI", 0, data, 0, StatusCode::kProtocolError},
      {"version 2", "RBHI", 2, data, 0, StatusCode::kProtocolError},
      {"reserved byte", "RBHI", kProtocolVersion, data, 1, StatusCode::kProtocolError},
      {"unknown channel", "RBHI", kProtocolVersion, 99, 0, StatusCode::kUnimplemented},
      {"channel 0", "RBHI", kProtocolVersion, 0, 0, StatusCode::kUnimplemented},
  };
  for (const BadHello& b : cases) {
    RawConnection c(owner_->address());
    ASSERT_TRUE(c.connected());
    auto reply = c.hello(b.channel, 0, b.version, b.magic, b.reserved);
    ASSERT_TRUE(reply.has_value()) << b.what << ": no reply";
    EXPECT_EQ(reply->first, static_cast<uint8_t>(b.expected)) << b.what << ": " << reply->second;
    EXPECT_FALSE(reply->second.empty()) << b.what;
    EXPECT_TRUE(c.closed_within(5s)) << b.what;
  }
  expect_reader_works();
}

TEST_F(TcpProtocolTest, HelloForAnotherManagerIsNotFound) {
  RawConnection c(owner_->address());
  ASSERT_TRUE(c.connected());
  auto reply = c.hello(static_cast<uint8_t>(Channel::kTcpData), owner_->identity().manager_id ^ 2);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->first, static_cast<uint8_t>(StatusCode::kNotFound)) << reply->second;
  EXPECT_TRUE(c.closed_within(5s));
  // The right id is accepted.
  RawConnection ok(owner_->address());
  auto good = ok.hello(static_cast<uint8_t>(Channel::kTcpData), owner_->identity().manager_id);
  ASSERT_TRUE(good.has_value());
  EXPECT_EQ(good->first, 0) << good->second;
}

TEST_F(TcpProtocolTest, GarbageInsteadOfAHello) {
  RawConnection c(owner_->address());
  const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(c.send_all(http, sizeof http - 1));
  auto reply = c.read_hello_reply();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->first, static_cast<uint8_t>(StatusCode::kProtocolError));
  EXPECT_TRUE(c.closed_within(5s));
  expect_reader_works();
}

TEST_F(TcpProtocolTest, UnknownRequestKindDropsTheConnection) {
  for (uint8_t kind : {0, 3, 0x81, 0xff}) {
    auto c = data_connection();
    auto h = request(RequestKind::kRead, 1, handle_, 0, 16);
    h.kind = kind;
    ASSERT_TRUE(c->send_all(bytes_of(h)));
    EXPECT_TRUE(c->closed_within(5s)) << "kind " << int(kind);
  }
  expect_reader_works();
  expect_release_is_prompt();
}

TEST_F(TcpProtocolTest, ReservedBitsDropTheConnection) {
  for (int field = 0; field < 3; ++field) {
    auto c = data_connection();
    auto h = request(RequestKind::kRead, 1, handle_, 0, 16);
    if (field == 0) h.flags = 1;
    if (field == 1) h.reserved0 = 1;
    if (field == 2) h.reserved1 = 0x80000000u;
    ASSERT_TRUE(c->send_all(bytes_of(h)));
    EXPECT_TRUE(c->closed_within(5s)) << "field " << field;
  }
  expect_reader_works();
}

TEST_F(TcpProtocolTest, AbsurdLengthsDropTheConnection) {
  for (uint64_t length : {uint64_t{0}, tcp::kMaxRequestBytes + 1, ~uint64_t{0}}) {
    for (RequestKind kind : {RequestKind::kRead, RequestKind::kWrite}) {
      auto c = data_connection();
      ASSERT_TRUE(c->send_all(bytes_of(request(kind, 1, handle_, 0, length))));
      EXPECT_TRUE(c->closed_within(5s)) << "length " << length;
    }
  }
  expect_reader_works();
  expect_release_is_prompt();
}

TEST_F(TcpProtocolTest, ValidRequestThenGarbageDropsAfterAnswering) {
  auto c = data_connection();
  auto good = bytes_of(request(RequestKind::kRead, 1, handle_, 8, 8));
  auto bad = request(RequestKind::kRead, 2, handle_, 0, 0);
  auto b = bytes_of(bad);
  good.insert(good.end(), b.begin(), b.end());
  ASSERT_TRUE(c->send_all(good));
  EXPECT_TRUE(c->closed_within(5s));
  expect_reader_works();
}

TEST_F(TcpProtocolTest, HalfAFrameThenClose) {
  for (size_t cut : {size_t{1}, size_t{30}, sizeof(RequestHeader) - 1}) {
    auto c = data_connection();
    auto frame = bytes_of(request(RequestKind::kRead, 1, handle_, 0, 16));
    ASSERT_TRUE(c->send_all(frame.data(), cut));
  }
  {
    // A write whose payload stops half way (into another buffer: the bytes
    // that arrived may have landed, which the protocol allows).
    auto other = owner_->register_buffer(allocate_or_die(200000));
    ASSERT_TRUE(other.ok());
    auto c = data_connection();
    std::vector<uint8_t> frame = bytes_of(request(RequestKind::kWrite, 1, *other, 0, 100000));
    frame.resize(frame.size() + 50000, 0xab);
    ASSERT_TRUE(c->send_all(frame));
  }
  {
    // A hello cut short.
    RawConnection c(owner_->address());
    ASSERT_TRUE(c.send_all("RBHI\x01", 5));
  }
  expect_reader_works();
  expect_release_is_prompt();
}

TEST_F(TcpProtocolTest, HalfAFrameThenStallIsDroppedAfterTheStallTimeout) {
  auto c = data_connection();
  auto frame = bytes_of(request(RequestKind::kRead, 1, handle_, 0, 16));
  // Timed from before the send: the owner's stall clock cannot start
  // earlier, however late this thread runs again after sending.
  auto start = Clock::now();
  ASSERT_TRUE(c->send_all(frame.data(), 20));
  EXPECT_TRUE(c->closed_within(kStall + 5s));
  auto took = Clock::now() - start;
  EXPECT_GE(took, kStall - 50ms) << "dropped before the stall timeout";
  expect_reader_works();
}

TEST_F(TcpProtocolTest, StalledWritePayloadIsDroppedAndUnpinned) {
  auto c = data_connection();
  std::vector<uint8_t> frame = bytes_of(request(RequestKind::kWrite, 1, handle_, 0, 300000));
  frame.resize(frame.size() + 1000, 0xab);
  ASSERT_TRUE(c->send_all(frame));
  EXPECT_TRUE(c->closed_within(kStall + 5s));
  expect_release_is_prompt();
}

TEST_F(TcpProtocolTest, IdleConnectionsAreNotDropped) {
  auto c = data_connection();
  EXPECT_FALSE(c->closed_within(kStall * 3)) << "an idle connection was dropped";
  ASSERT_TRUE(c->send_all(bytes_of(request(RequestKind::kRead, 1, handle_, 0, 100))));
  expect_read_reply(*c, 1, 0, 100);
}

TEST_F(TcpProtocolTest, SilentConnectionsDoNotBlockOthers) {
  std::vector<std::unique_ptr<RawConnection>> silent;
  for (int i = 0; i < 20; ++i)
    silent.push_back(std::make_unique<RawConnection>(owner_->address()));
  expect_reader_works();
}

TEST_F(TcpProtocolTest, ManyConnectionsComeAndGo) {
  for (int i = 0; i < 200; ++i) {
    RawConnection c(owner_->address());
    ASSERT_TRUE(c.connected()) << i;
    if (i % 2 == 0) {
      auto reply = c.hello(static_cast<uint8_t>(Channel::kTcpData));
      ASSERT_TRUE(reply.has_value()) << i;
    }
  }
  expect_reader_works();
}

// A reader that asks for a large read and then stops reading leaves the
// owner blocked sending from the pinned buffer. release() must not wait for
// the stall timeout; after its grace period it aborts that connection.
TEST_F(TcpProtocolTest, ReleaseAbortsAReaderThatStoppedReading) {
  Config config;
  config.backends = {"tcp"};
  config.io_stall_timeout = std::chrono::minutes(5);
  auto owner = Manager::create(config);
  ASSERT_TRUE(owner.ok());
  auto mem = LocalMemory::allocate(64 << 20);
  ASSERT_TRUE(mem.ok());
  auto handle = (*owner)->register_buffer(*mem);
  ASSERT_TRUE(handle.ok());

  RawConnection c((*owner)->address());
  auto reply = c.hello(static_cast<uint8_t>(Channel::kTcpData));
  ASSERT_TRUE(reply.has_value());
  ASSERT_TRUE(c.send_all(bytes_of(request(RequestKind::kRead, 1, *handle, 0, 64 << 20))));
  ResponseHeader r{};
  ASSERT_TRUE(c.recv_exact(&r, sizeof r)) << "the owner started answering";
  std::this_thread::sleep_for(100ms);  // the owner is now blocked on a full socket

  auto start = Clock::now();
  Status s = (*owner)->release(*handle);
  auto took = Clock::now() - start;
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_GE(took, 500ms) << "release did not wait: the test did not stall the owner";
  EXPECT_LT(took, 10s) << "release waited for the stalled reader";
  EXPECT_TRUE(c.closed_within(10s)) << "the stalled connection was not aborted";
}

// The owner shutting down while raw connections sit in every state.
TEST_F(TcpProtocolTest, ShutdownWithConnectionsInEveryState) {
  RawConnection silent(owner_->address());
  RawConnection half_hello(owner_->address());
  ASSERT_TRUE(half_hello.send_all("RBH", 3));
  auto idle = data_connection();
  auto half_frame = data_connection();
  ASSERT_TRUE(
      half_frame->send_all(bytes_of(request(RequestKind::kRead, 1, handle_, 0, 8)).data(), 10));
  auto start = Clock::now();
  owner_->shutdown();
  EXPECT_LT(Clock::now() - start, 5s) << "shutdown waited for a connection";
  EXPECT_TRUE(idle->closed_within(5s));
  EXPECT_TRUE(half_frame->closed_within(5s));
  EXPECT_EQ(owner_->registered_count(), 0u);
  auto again = owner_->register_buffer(memory_);
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rdmabuf

namespace rdmabuf {
namespace {

// --- The reader side against a hand-written owner ---------------------------

// A fake owner: answers every hello as the manager the caller expects, and
// serves reads with zeros. The first connection for each manager id is
// closed right after its first reply (so that the reader's peer for that
// owner goes idle); later connections stay open, as a real owner's do.
class FakeOwner {
 public:
  FakeOwner() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
    EXPECT_EQ(::listen(listen_fd_, 128), 0);
    socklen_t len = sizeof sin;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sin), &len);
    address_ = "127.0.0.1:" + std::to_string(ntohs(sin.sin_port));
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FakeOwner() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    for (auto& t : connections_)
      t.join();
    ::close(listen_fd_);
  }
  const std::string& address() const { return address_; }

 private:
  void accept_loop() {
    while (!stop_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      connections_.emplace_back([this, fd] { serve(fd); });
    }
  }
  // Blocking reads with a poll so that the destructor can stop us.
  bool read_exact(int fd, void* data, size_t size) {
    auto* p = static_cast<uint8_t*>(data);
    while (size > 0) {
      if (stop_.load()) return false;
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0) continue;
      ssize_t n = ::recv(fd, p, size, 0);
      if (n <= 0) return false;
      p += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }
  void serve(int fd) {
    uint8_t hello[24];
    if (read_exact(fd, hello, sizeof hello)) {
      uint64_t expected;
      std::memcpy(&expected, hello + 16, 8);
      bool first;
      {
        std::lock_guard lock(mu_);
        first = seen_.insert(expected).second;
      }
      uint8_t reply[24] = {'R', 'B', 'O', 'K', 1, 0, 0, 0};
      std::memcpy(reply + 8, &expected, 8);
      bool ok = ::send(fd, reply, sizeof reply, MSG_NOSIGNAL) == sizeof reply;
      RequestHeader h;
      while (ok && read_exact(fd, &h, sizeof h)) {
        if (h.kind != static_cast<uint8_t>(RequestKind::kRead) || h.length > (1 << 20)) break;
        ResponseHeader r{};
        r.kind = h.kind | tcp::kResponseBit;
        r.request_id = h.request_id;
        r.payload = h.length;
        std::vector<uint8_t> out(sizeof r + h.length, 0);
        std::memcpy(out.data(), &r, sizeof r);
        if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size()))
          break;
        if (first) break;
      }
    }
    ::close(fd);
  }

  int listen_fd_ = -1;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // only the acceptor adds
  std::mutex mu_;
  std::set<uint64_t> seen_;
};

// A reader that meets many owners forgets the idle ones (TcpBackend prunes
// them once it knows kPrunePeersAt = 64). A submit that picked an idle peer
// just before another thread pruned it holds that peer's last reference;
// when the submit drops it, the peer must go away without blocking, even
// though the submit's op has since connected its stream.
//
// BUG: it blocks until the manager shuts down. TcpBackend::submit
// (backends/tcp/tcp_backend.cc) keeps the Peer in a shared_ptr; if
// prune_idle_peers() erased it from peers_ between peer_for() and
// Peer::submit(), the submit's own copy is the last one. Peer::submit starts
// a stream thread, which connects and stays connected; when
// TcpBackend::submit returns, ~Peer -> ~Stream -> Stream::stop() joins that
// thread, but Stream::run() only exits on the backend-wide stopping flag or
// a closed connection (stop() sets stopped_, which run() never reads), so
// the caller's submit() -- and read_into/write_from -- hang. Fix: prune only
// peers that nothing else references (it->second.use_count() == 1 under
// peers_mu_, plus idle()), so that a Peer is never destroyed outside
// shutdown while a submit uses it; or make Stream::run() exit once
// stopped_ is set and its work is done.
TEST(TcpReaderTest, PrunedPeerDoesNotHangTheSubmit) {
  Config config;
  config.backends = {"tcp"};
  config.tcp_streams = 1;
  auto owner = Manager::create(config);
  ASSERT_TRUE(owner.ok());
  std::vector<std::byte> bytes(4096);
  auto real = (*owner)->register_buffer(LocalMemory::from_span(bytes));
  ASSERT_TRUE(real.ok());
  auto reader = Manager::create(config);
  ASSERT_TRUE(reader.ok());

  // Owners that never answer the hello keep 64 peers busy (never pruned),
  // so that every new owner makes the backend prune.
  int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
  ASSERT_EQ(::listen(silent, 256), 0);
  socklen_t len = sizeof sin;
  ::getsockname(silent, reinterpret_cast<sockaddr*>(&sin), &len);
  const std::string silent_address = "127.0.0.1:" + std::to_string(ntohs(sin.sin_port));
  auto forged = [&](uint64_t manager_id, const std::string& address) {
    auto h = testing::with_manager_id(*real, manager_id);
    EXPECT_TRUE(h.ok());
    auto a = testing::with_address(*h, address);
    EXPECT_TRUE(a.ok());
    auto s = a->slice(0, 16);
    EXPECT_TRUE(s.ok());
    return *s;
  };
  std::vector<LocalMemory> parked_dst;
  std::vector<Transfer> parked;
  for (uint64_t i = 0; i < 64; ++i) {
    parked_dst.push_back(allocate_or_die(16));
    parked.push_back((*reader)->submit(
        {Op::read(forged(0x5000000 + i * 2 + 1, silent_address), parked_dst.back())}, 60s));
  }

  FakeOwner fake;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> progress{0};
  // Churn: owners at a closed port (1); each is a new peer, so each submit
  // prunes.
  std::vector<std::thread> churn;
  for (uint64_t t = 0; t < 2; ++t) {
    churn.emplace_back([&, t] {
      LocalMemory dst = allocate_or_die(16);
      for (uint64_t i = 0; !stop.load(); ++i) {
        (void)(*reader)->read_into(forged(0x7000000 + (i * 2 + t) * 2 + 1, "127.0.0.1:1"), dst, 5s);
      }
    });
  }
  // The victim: each fake owner once (its connection closes: the peer goes
  // idle), then again (the peer may be pruned meanwhile).
  std::thread victim([&] {
    LocalMemory dst = allocate_or_die(16);
    // The race is narrow: up to 3000 rounds, or about 3 s (it shows within
    // about 100 rounds here).
    const auto begin = Clock::now();
    for (uint64_t i = 0; i < 3000 && Clock::now() - begin < 3s && !stop.load(); ++i) {
      RemoteBuffer h = forged(0x9000000 + i * 2 + 1, fake.address());
      (void)(*reader)->read_into(h, dst, 5s);
      std::this_thread::sleep_for(2ms);  // the fake owner closes; the stream exits
      (void)(*reader)->read_into(h, dst, 5s);
      progress.fetch_add(1);
    }
    stop = true;
  });
  uint64_t last = 0;
  auto last_change = Clock::now();
  bool hung = false;
  while (!stop.load()) {
    std::this_thread::sleep_for(50ms);
    uint64_t now = progress.load();
    if (now != last) {
      last = now;
      last_change = Clock::now();
    } else if (Clock::now() - last_change > 10s) {
      hung = true;
      break;
    }
  }
  EXPECT_FALSE(hung) << "a read_into has not returned for 10 s (after " << last
                     << " rounds): a pruned peer's destructor waits for its stream";
  stop = true;
  (*reader)->shutdown();  // unblocks a hung submit: its stream sees the stopping flag
  victim.join();
  for (auto& t : churn)
    t.join();
  parked.clear();
  ::close(silent);
}

}  // namespace
}  // namespace rdmabuf
