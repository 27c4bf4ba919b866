// Fuzzes the ibverbs backend's control frames (backends/ibverbs/
// handshake.cc), on channel 3 after the hello: what an owner reads (the
// reader's connect, read_connect, then its queries, read_query) and what a
// reader reads (the owner's accepted, read_accepted, then its answers,
// parse_answer).
//
// Feeds each input twice through a socket pair that holds exactly the
// input and then end of stream: once as the owner reads a connection
// (connect, then queries until one fails), once as the reader does
// (accepted, then 24-byte answers until the bytes run out).
//
// Checks every decoded frame against a decoder written from
// docs/wire-format.md ("The ibverbs backend's context and handshake"): the
// same verdict (a value, or the same error code), the same fields, an
// accepted message of at most 1024 bytes passed on as the owner's status;
// and that a frame that decodes re-encodes, with the sender's encoder, to
// exactly the bytes it came from (so reserved bytes are zero, a device name
// has its NUL padding, a packet sequence number fits in 24 bits and a path
// MTU is an ibv_mtu).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "backends/ibverbs/handshake.h"
#include "fuzz/fuzz_support.h"

namespace rdmabuf::fuzz {
namespace {

using ibverbs::Endpoint;

constexpr size_t kEndpoint = 32;
constexpr size_t kClaim = 32;  // u64 id, u8[16] token, u64 region size
constexpr size_t kConnect = 8 + 64 + kEndpoint + kClaim;
constexpr size_t kAcceptedFixed = 8 + kEndpoint + 4;
constexpr size_t kQuery = 8 + kClaim;
constexpr size_t kAnswer = 24;
constexpr uint32_t kMaxMessage = 1024;
constexpr uint8_t kMaxCode = 11;  // StatusCode::kInternal

bool all_zero(std::span<const uint8_t> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

Result<Endpoint> reference_endpoint(std::span<const uint8_t> in) {
  Endpoint e;
  e.qpn = load<uint32_t>(in, 0);
  e.psn = load<uint32_t>(in, 4);
  std::memcpy(e.gid.raw, in.data() + 8, 16);
  e.lid = load<uint16_t>(in, 24);
  e.mtu = in[26];
  if (e.psn > 0xffffff || e.mtu < 1 || e.mtu > 5 || !all_zero(in.subspan(27, 5))) {
    return ProtocolError("malformed endpoint");
  }
  return e;
}

bool same_endpoint(const Endpoint& a, const Endpoint& b) {
  return a.qpn == b.qpn && a.psn == b.psn && a.lid == b.lid && a.mtu == b.mtu &&
         std::memcmp(a.gid.raw, b.gid.raw, sizeof a.gid.raw) == 0;
}

// What `send` wrote, given a socket pair to write on.
template <typename Send>
std::vector<uint8_t> encoded(Send send) {
  SocketPair echo = socket_pair();
  RDMABUF_FUZZ_CHECK(send(echo.local.get()).ok());
  return take_available(echo.remote.get());
}

bool same_bytes(const std::vector<uint8_t>& a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// --- The owner's side: connect, then queries ---------------------------------

ibverbs::HandleClaim reference_claim(std::span<const uint8_t> in) {
  ibverbs::HandleClaim c;
  c.id = load<uint64_t>(in, 0);
  std::memcpy(c.token.data(), in.data() + 8, 16);
  c.region_size = load<uint64_t>(in, 24);
  return c;
}

Result<ibverbs::ConnectRequest> reference_connect(std::span<const uint8_t> in) {
  if (in.size() < kConnect) return Unavailable("short");
  if (std::memcmp(in.data(), "RBIV", 4) != 0 || load<uint16_t>(in, 4) != 2 ||
      load<uint16_t>(in, 6) != 0) {
    return ProtocolError("malformed");
  }
  std::span<const uint8_t> name = in.subspan(8, 64);
  size_t length = static_cast<size_t>(std::find(name.begin(), name.end(), 0) - name.begin());
  if (length == name.size() || !all_zero(name.subspan(length))) return ProtocolError("name");
  RDMABUF_ASSIGN_OR_RETURN(Endpoint e, reference_endpoint(in.subspan(72, kEndpoint)));
  return ibverbs::ConnectRequest{std::string(name.begin(), name.begin() + length), e,
                                 reference_claim(in.subspan(72 + kEndpoint, kClaim))};
}

void check_owner_side(std::span<const uint8_t> in) {
  SocketPair pair = fed_with(in);
  auto got = ibverbs::read_connect(pair.local.get(), Clock::now(), -1);
  auto want = reference_connect(in);
  RDMABUF_FUZZ_CHECK(got.status().code() == want.status().code());
  if (!got.ok()) return;
  RDMABUF_FUZZ_CHECK(got->device == want->device && same_endpoint(got->endpoint, want->endpoint) &&
                     got->claim == want->claim);
  RDMABUF_FUZZ_CHECK(same_bytes(encoded([&](int fd) {
                                  return ibverbs::send_connect(fd, got->device, got->endpoint,
                                                               got->claim, Clock::now(), -1);
                                }),
                                in.first(kConnect)));
  for (size_t pos = kConnect;; pos += kQuery) {
    auto query = ibverbs::read_query(pair.local.get(), -1);
    if (in.size() - pos < kQuery) {
      RDMABUF_FUZZ_CHECK(query.status().code() == StatusCode::kUnavailable);
      return;
    }
    std::span<const uint8_t> q = in.subspan(pos, kQuery);
    if (q[0] != 1 || !all_zero(q.subspan(1, 7))) {
      RDMABUF_FUZZ_CHECK(query.status().code() == StatusCode::kProtocolError);
      return;
    }
    RDMABUF_FUZZ_CHECK(query.ok() && *query == reference_claim(q.subspan(8, kClaim)));
    RDMABUF_FUZZ_CHECK(same_bytes(
        encoded([&](int fd) { return ibverbs::send_query(fd, *query, Clock::now(), -1); }), q));
  }
}

// --- The reader's side: accepted, then answers -------------------------------

// Sets `*refused` when the verdict is the owner's own status.
Result<Endpoint> reference_accepted(std::span<const uint8_t> in, bool* refused) {
  *refused = false;
  if (in.size() < kAcceptedFixed) return Unavailable("short");
  uint8_t code = in[0];
  uint32_t length = load<uint32_t>(in, 8 + kEndpoint);
  if (code > kMaxCode || !all_zero(in.subspan(1, 7)) || length > kMaxMessage) {
    return ProtocolError("malformed");
  }
  if (in.size() - kAcceptedFixed < length) return Unavailable("short");
  if (code != 0) {
    *refused = true;
    return Status(static_cast<StatusCode>(code),
                  std::string(in.begin() + kAcceptedFixed, in.begin() + kAcceptedFixed + length));
  }
  return reference_endpoint(in.subspan(8, kEndpoint));
}

void check_reader_side(std::span<const uint8_t> in) {
  SocketPair pair = fed_with(in);
  auto got = ibverbs::read_accepted(pair.local.get(), Clock::now(), -1);
  bool refused = false;
  auto want = reference_accepted(in, &refused);
  RDMABUF_FUZZ_CHECK(got.status().code() == want.status().code());
  if (refused) {
    RDMABUF_FUZZ_CHECK(got.status() == want.status());
    RDMABUF_FUZZ_CHECK(got.status().message().size() <= kMaxMessage);
  }
  if (!got.ok()) return;
  RDMABUF_FUZZ_CHECK(same_endpoint(*got, *want));
  size_t pos = kAcceptedFixed;  // an OK answer carries no message worth keeping
  pos += load<uint32_t>(in, 8 + kEndpoint);
  for (; in.size() - pos >= kAnswer; pos += kAnswer) {
    std::array<uint8_t, kAnswer> bytes;
    RDMABUF_FUZZ_CHECK(recv_exact(pair.local.get(), bytes.data(), kAnswer, Clock::now()).ok());
    auto answer = ibverbs::parse_answer(bytes);
    std::span<const uint8_t> a = in.subspan(pos, kAnswer);
    const uint32_t rkey = load<uint32_t>(a, 16);
    // A refusal carries no key.
    if (a[0] > kMaxCode || !all_zero(a.subspan(1, 7)) || !all_zero(a.subspan(20, 4)) ||
        (a[0] != 0 && rkey != 0)) {
      RDMABUF_FUZZ_CHECK(answer.status().code() == StatusCode::kProtocolError);
      continue;
    }
    RDMABUF_FUZZ_CHECK(answer.ok() && answer->id == load<uint64_t>(a, 8) &&
                       answer->code == static_cast<StatusCode>(a[0]) && answer->rkey == rkey);
    RDMABUF_FUZZ_CHECK(
        same_bytes(encoded([&](int fd) { return ibverbs::send_answer(fd, *answer, -1); }), a));
  }
}

}  // namespace
}  // namespace rdmabuf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  rdmabuf::fuzz::check_owner_side(in);
  rdmabuf::fuzz::check_reader_side(in);
  return 0;
}
