// Fuzzes the hello (common/hello.cc): what a manager's listener reads first
// from every inbound connection (read_hello, called by the manager for each
// connection its listener accepts), and the reply a caller reads after
// sending its own (exchange_hello, called by every tcp stream and ibverbs
// handshake before anything else).
//
// Feeds each input, through a socket pair that holds exactly the input and
// then end of stream, to read_hello and to exchange_hello (expecting the
// owner kOwnerId).
//
// Checks each result against a decoder written from docs/wire-format.md
// ("The hello"): the same verdict (a value, or the same error code); the
// same fields; for a refusal, the listener's own status and message, never
// longer than 1024 bytes; and that a hello that decodes re-encodes, with
// the caller's encoder, to the 24 bytes it came from.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/hello.h"
#include "common/socket.h"
#include "fuzz/fuzz_support.h"

namespace rdmabuf::fuzz {
namespace {

constexpr size_t kFixed = 24;
constexpr uint32_t kMaxMessage = 1024;
constexpr uint8_t kMaxCode = 11;  // StatusCode::kInternal

// docs/wire-format.md's hello, as the listener must read it.
Result<Hello> reference_hello(std::span<const uint8_t> in) {
  if (in.size() < kFixed) return Unavailable("short");
  if (std::memcmp(in.data(), "RBHI", 4) != 0 || load<uint16_t>(in, 4) != 1 || in[7] != 0) {
    return ProtocolError("malformed");
  }
  return Hello{static_cast<Channel>(in[6]), load<uint64_t>(in, 8), load<uint64_t>(in, 16)};
}

// docs/wire-format.md's reply, as a caller expecting `expected` must read
// it. Sets `*refused` when the verdict is the listener's own status.
Result<uint64_t> reference_reply(std::span<const uint8_t> in, uint64_t expected, bool* refused) {
  *refused = false;
  if (in.size() < kFixed) return Unavailable("short");
  if (std::memcmp(in.data(), "RBOK", 4) != 0 || load<uint16_t>(in, 4) != 1) {
    return ProtocolError("malformed");
  }
  uint8_t code = in[6];
  uint64_t server = load<uint64_t>(in, 8);
  uint32_t length = load<uint32_t>(in, 16);
  if (length > kMaxMessage || code > kMaxCode || in[7] != 0 || load<uint32_t>(in, 20) != 0) {
    return ProtocolError("malformed");
  }
  if (in.size() - kFixed < length) return Unavailable("short");
  if (code != 0) {
    *refused = true;
    return Status(static_cast<StatusCode>(code),
                  std::string(reinterpret_cast<const char*>(in.data()) + kFixed, length));
  }
  if (server != expected) return NotFound("another manager");
  return server;
}

void check_read_hello(std::span<const uint8_t> in) {
  SocketPair pair = fed_with(in);
  auto got = read_hello(pair.local.get(), Clock::now());
  auto want = reference_hello(in);
  RDMABUF_FUZZ_CHECK(got.status().code() == want.status().code());
  if (!got.ok()) return;
  RDMABUF_FUZZ_CHECK(got->channel == want->channel && got->caller_id == want->caller_id &&
                     got->expected_id == want->expected_id);
  // Re-encoded by the caller's side: exchange_hello sends, then times out
  // at once waiting for a reply.
  SocketPair echo = socket_pair();
  RDMABUF_FUZZ_CHECK(exchange_hello(echo.local.get(), *got, Clock::now()).status().code() ==
                     StatusCode::kDeadlineExceeded);
  std::vector<uint8_t> again = take_available(echo.remote.get());
  RDMABUF_FUZZ_CHECK(again.size() == kFixed && std::memcmp(again.data(), in.data(), kFixed) == 0);
}

void check_reply(std::span<const uint8_t> in) {
  SocketPair pair = fed_with(in);
  Hello hello{Channel::kTcpData, kReaderId, kOwnerId};
  auto got = exchange_hello(pair.local.get(), hello, Clock::now());
  bool refused = false;
  auto want = reference_reply(in, kOwnerId, &refused);
  RDMABUF_FUZZ_CHECK(got.status().code() == want.status().code());
  if (got.ok()) {
    RDMABUF_FUZZ_CHECK(*got == *want);
  } else if (refused) {
    // The listener's status, message and all.
    RDMABUF_FUZZ_CHECK(got.status() == want.status());
    RDMABUF_FUZZ_CHECK(got.status().message().size() <= kMaxMessage);
  }
}

}  // namespace
}  // namespace rdmabuf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  rdmabuf::fuzz::check_read_hello(in);
  rdmabuf::fuzz::check_reply(in);
  return 0;
}
