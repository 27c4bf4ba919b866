// The ibverbs backend's control frames (backends/ibverbs/handshake.h): each
// frame its sender writes decodes to what was sent, and the decoders refuse
// every byte docs/wire-format.md says must be zero; a tagged write's notice
// decodes only at its size and magic; and the RDMA channel's counts carried
// as immediates widen forward only. Built only with the
// verbs header (an endpoint carries an ibv_gid).
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <span>
#include <vector>

#include "backends/ibverbs/handshake.h"
#include "common/socket.h"
#include "tests/helpers/printers.h"

namespace rdmabuf::ibverbs {
namespace {

using namespace std::chrono_literals;

struct Pair {
  Fd a, b;
};

Pair socket_pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{Fd(fds[0]), Fd(fds[1])};
}

// The bytes `send` writes on a socket.
template <typename Send>
std::vector<uint8_t> frame(Send send) {
  Pair p = socket_pair();
  EXPECT_TRUE(send(p.a.get()).ok());
  ::shutdown(p.a.get(), SHUT_WR);
  std::vector<uint8_t> out;
  uint8_t chunk[4096];
  ssize_t n;
  while ((n = ::recv(p.b.get(), chunk, sizeof chunk, 0)) > 0)
    out.insert(out.end(), chunk, chunk + n);
  return out;
}

// A socket whose reader finds exactly `bytes`, then the end.
Pair holding(const std::vector<uint8_t>& bytes) {
  Pair p = socket_pair();
  EXPECT_TRUE(send_exact(p.b.get(), bytes.data(), bytes.size(), Clock::now() + 5s).ok());
  ::shutdown(p.b.get(), SHUT_WR);
  return p;
}

Endpoint an_endpoint() {
  Endpoint e;
  e.qpn = 0x11;
  e.psn = 0x123456;
  e.gid.raw[15] = 1;
  e.lid = 3;
  e.mtu = IBV_MTU_1024;
  return e;
}

HandleClaim a_claim() {
  HandleClaim c;
  c.id = 5;
  c.token.fill(7);
  c.region_size = 4096;
  return c;
}

std::vector<uint8_t> connect_frame() {
  return frame([](int fd) {
    return send_connect(fd, "rxe0", an_endpoint(), a_claim(), Clock::now() + 5s, -1);
  });
}

StatusCode connect_verdict(const std::vector<uint8_t>& bytes) {
  Pair p = holding(bytes);
  return read_connect(p.a.get(), Clock::now() + 5s, -1).status().code();
}

TEST(IbverbsHandshakeTest, ConnectRoundTrips) {
  std::vector<uint8_t> bytes = connect_frame();
  ASSERT_EQ(bytes.size(), 8u + kDeviceNameBytes + 32u + 32u);
  Pair p = holding(bytes);
  auto request = read_connect(p.a.get(), Clock::now() + 5s, -1);
  ASSERT_TRUE(request.ok()) << request.status().to_string();
  EXPECT_EQ(request->device, "rxe0");
  EXPECT_EQ(request->endpoint.qpn, 0x11u);
  EXPECT_EQ(request->endpoint.psn, 0x123456u);
  EXPECT_EQ(request->endpoint.mtu, IBV_MTU_1024);
  EXPECT_EQ(request->claim, a_claim()) << "the handle the reader presents";
}

// Each of these was accepted until fuzz_ibverbs_frames checked that a frame
// that decodes re-encodes to the same bytes.
TEST(IbverbsHandshakeTest, ConnectRefusesNonZeroPaddingAndReservedBytes) {
  const size_t name = 8, endpoint = 8 + kDeviceNameBytes;
  std::vector<uint8_t> after_name = connect_frame();
  after_name[name + 10] = 'x';  // "rxe0\0...x...": bytes after the name's NUL
  EXPECT_EQ(connect_verdict(after_name), StatusCode::kProtocolError);
  std::vector<uint8_t> no_nul = connect_frame();
  std::memset(no_nul.data() + name, 'd', kDeviceNameBytes);
  EXPECT_EQ(connect_verdict(no_nul), StatusCode::kProtocolError);
  for (size_t at : {27, 28, 31}) {  // the endpoint's reserved u8 and u32
    std::vector<uint8_t> bytes = connect_frame();
    bytes[endpoint + at] = 1;
    EXPECT_EQ(connect_verdict(bytes), StatusCode::kProtocolError) << "endpoint byte " << at;
  }
}

TEST(IbverbsHandshakeTest, QueryRefusesReservedBytes) {
  std::vector<uint8_t> good =
      frame([&](int fd) { return send_query(fd, a_claim(), Clock::now() + 5s, -1); });
  {
    Pair p = holding(good);
    auto q = read_query(p.a.get(), -1);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ(*q, a_claim());
  }
  std::vector<uint8_t> bad = good;
  bad[3] = 1;
  Pair p = holding(bad);
  EXPECT_EQ(read_query(p.a.get(), -1).status().code(), StatusCode::kProtocolError);
}

TEST(IbverbsHandshakeTest, AcceptedRefusesReservedBytes) {
  std::vector<uint8_t> good = frame(
      [](int fd) { return send_accepted(fd, Status::Ok(), an_endpoint(), Clock::now() + 5s, -1); });
  {
    Pair p = holding(good);
    auto e = read_accepted(p.a.get(), Clock::now() + 5s, -1);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(e->qpn, 0x11u);
  }
  std::vector<uint8_t> bad = good;
  bad[5] = 1;
  Pair p = holding(bad);
  EXPECT_EQ(read_accepted(p.a.get(), Clock::now() + 5s, -1).status().code(),
            StatusCode::kProtocolError);
}

StatusCode answer_verdict(const std::vector<uint8_t>& bytes) {
  return parse_answer(std::span<const uint8_t, kAnswerBytes>(bytes.data(), kAnswerBytes))
      .status()
      .code();
}

TEST(IbverbsHandshakeTest, AnswerCarriesTheKeyAndRefusesReservedBytes) {
  std::vector<uint8_t> granted = frame([](int fd) {
    return send_answer(fd, {9, StatusCode::kOk, 0xabcdef12}, -1);
  });
  ASSERT_EQ(granted.size(), kAnswerBytes);
  auto a = parse_answer(std::span<const uint8_t, kAnswerBytes>(granted.data(), kAnswerBytes));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->id, 9u);
  EXPECT_EQ(a->code, StatusCode::kOk);
  EXPECT_EQ(a->rkey, 0xabcdef12u);

  // A refusal carries no key (the sender writes none whatever it was given).
  std::vector<uint8_t> refused = frame([](int fd) {
    return send_answer(fd, {9, StatusCode::kNotFound, 0xabcdef12}, -1);
  });
  a = parse_answer(std::span<const uint8_t, kAnswerBytes>(refused.data(), kAnswerBytes));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->code, StatusCode::kNotFound);
  EXPECT_EQ(a->rkey, 0u);
  std::vector<uint8_t> keyed_refusal = refused;
  keyed_refusal[16] = 1;
  EXPECT_EQ(answer_verdict(keyed_refusal), StatusCode::kProtocolError);

  for (size_t at : {7, 20, 23}) {
    std::vector<uint8_t> bad = granted;
    bad[at] = 1;
    EXPECT_EQ(answer_verdict(bad), StatusCode::kProtocolError) << "byte " << at;
  }
}

// A channel SEND's immediate (the low 32 bits of a posted-receives count)
// widens to the count it stands for, across the 32-bit wrap; one at or
// behind the last heard, or 2^31 or more ahead of it, leaves it.
// A tagged write's notice: what the writer encodes decodes to the same
// record, byte for byte as docs/wire-format.md lays it out; any other size
// or magic is refused, never read past.
TEST(IbverbsNotice, RoundTripsAndRefusesOtherSizesAndMagic) {
  NoticeRecord sent;
  sent.tag = 0xfeedf00d;
  sent.endpoint_key = 0x0123456789abcdef;
  sent.buffer_id = 42;
  sent.offset = 1 << 20;
  sent.length = 4096;
  for (size_t i = 0; i < sent.token.size(); ++i)
    sent.token[i] = static_cast<uint8_t>(0xa0 + i);
  const std::array<uint8_t, kNoticeBytes> bytes = encode_notice(sent);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "RBNT");
  uint32_t tag = 0;
  std::memcpy(&tag, bytes.data() + 4, 4);
  EXPECT_EQ(tag, sent.tag);
  EXPECT_EQ(bytes[40], 0xa0);  // the token last

  auto got = decode_notice(bytes);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->tag, sent.tag);
  EXPECT_EQ(got->endpoint_key, sent.endpoint_key);
  EXPECT_EQ(got->buffer_id, sent.buffer_id);
  EXPECT_EQ(got->offset, sent.offset);
  EXPECT_EQ(got->length, sent.length);
  EXPECT_EQ(got->token, sent.token);

  std::vector<uint8_t> longer(bytes.begin(), bytes.end());
  longer.push_back(0);
  EXPECT_EQ(decode_notice(longer).status().code(), StatusCode::kProtocolError);
  EXPECT_EQ(decode_notice(std::span(bytes).first(kNoticeBytes - 1)).status().code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(decode_notice({}).status().code(), StatusCode::kProtocolError);
  std::array<uint8_t, kNoticeBytes> other = bytes;
  other[3] = 'X';
  EXPECT_EQ(decode_notice(other).status().code(), StatusCode::kProtocolError);
}

TEST(IbverbsChannelCount, ImmediatesWidenForwardOnly) {
  EXPECT_EQ(widen_posted_count(32, 40), 40u);
  EXPECT_EQ(widen_posted_count(40, 40), 40u);
  EXPECT_EQ(widen_posted_count(40, 32), 40u) << "an older count";
  constexpr uint64_t k2to32 = uint64_t{1} << 32;
  EXPECT_EQ(widen_posted_count(k2to32 - 8, 8), k2to32 + 8) << "across the wrap";
  EXPECT_EQ(widen_posted_count(k2to32 + 8, 0xfffffff8u), k2to32 + 8) << "behind, across the wrap";
  EXPECT_EQ(widen_posted_count(3 * k2to32 + 100, 99), 3 * k2to32 + 100);
  const uint32_t half = uint32_t{1} << 31;
  EXPECT_EQ(widen_posted_count(100, 100 + half - 1), 100 + uint64_t{half} - 1);
  EXPECT_EQ(widen_posted_count(100, 100 + half), 100u) << "as far behind as ahead: not taken";
}

}  // namespace
}  // namespace rdmabuf::ibverbs
