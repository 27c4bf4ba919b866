// Fuzzes the endpoint handshake (core/endpoint/handshake.cc; docs/wire-format.md,
// "Endpoint control frames": kHello, kChannelOffer, kChannelAnswer,
// kChannelReady), from both ends, against a real Manager whose memory
// backend is viable, so that shared rings are offered and offers of them
// are weighed (ShmChannel::open on what the input names).
//
// The first byte of each input picks the side the input plays; the rest
// is every byte that side sends, then the end of its stream:
// - even: a peer that connects to an EndpointListener (the bytes: its
//   hello, its channel offer and anything after), while accept() waits;
// - odd: a listener that Manager::connect() reached (the bytes: its hello
//   and its channel answer).
//
// Checks: nothing crashes or touches memory it should not (AddressSanitizer);
// the handshake ends within its limit: accept() either returns an endpoint
// or drops the connection, and connect() returns an endpoint or one of the
// errors a peer can cause (ProtocolError for malformed or lying frames,
// Unavailable for a stream that ended early); and what was accepted or
// connected can be closed.
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/socket.h"
#include "fuzz/fuzz_support.h"
#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/raw_endpoint.h"

namespace {

using namespace rdmabuf;
using namespace std::chrono_literals;
using rdmabuf::testing::RawEndpointPeer;

// Longer than the handshake's own limit (5 s): past it, the side under
// test hangs.
constexpr auto kPatience = 8s;

Manager& manager() {
  static std::unique_ptr<Manager> m = [] {
    Config config;
    config.backends = {"tcp", "memory"};
    config.listen_address = "127.0.0.1:0";
    // Each refused handshake is worth a warning in a service, not here.
    config.log_level = LogLevel::kError;
    auto made = Manager::create(config);
    RDMABUF_FUZZ_CHECK(made.ok());
    return std::move(made).value();
  }();
  return *m;
}

// The input is what a connecting peer sends; accept() answers it.
void play_the_connecting_peer(std::span<const uint8_t> bytes) {
  auto listener = manager().listen("127.0.0.1:0");
  RDMABUF_FUZZ_CHECK(listener.ok());
  auto raw = RawEndpointPeer::connect((*listener)->address());
  RDMABUF_FUZZ_CHECK(raw.has_value());
  // Longer than the wait below: a hang is caught there, as a hang.
  auto accepted =
      std::async(std::launch::async, [&] { return (*listener)->accept(kPatience + 2s); });
  raw->send(bytes);  // refused when the listener dropped the connection already: fine
  raw->shut_down_writes();
  // Either accept() takes the handshake, or it drops the connection (and
  // would wait on for another): then it is stopped.
  const Deadline give_up = Clock::now() + kPatience;
  while (accepted.wait_for(0s) != std::future_status::ready) {
    RDMABUF_FUZZ_CHECK(Clock::now() < give_up);
    if (raw->closed_by_peer(10ms)) (*listener)->close();
  }
  auto endpoint = accepted.get();
  if (endpoint.ok()) {
    (*endpoint)->close();
  } else {
    RDMABUF_FUZZ_CHECK(endpoint.status().code() == StatusCode::kCancelled);
  }
}

// The input is what a listener answers; connect() reads it.
void play_the_listener(std::span<const uint8_t> bytes) {
  auto where = parse_host_port("127.0.0.1:0");
  RDMABUF_FUZZ_CHECK(where.ok());
  auto server = listen_tcp(*where, 1);
  RDMABUF_FUZZ_CHECK(server.ok());
  auto bound = local_address(server->get());
  RDMABUF_FUZZ_CHECK(bound.ok());
  auto connected = std::async(std::launch::async,
                              [&] { return manager().connect(bound->to_string(), kPatience); });
  RDMABUF_FUZZ_CHECK(wait_fd(server->get(), POLLIN, Clock::now() + kPatience).ok());
  Fd peer(::accept4(server->get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  RDMABUF_FUZZ_CHECK(peer.valid());
  // Refused when connect() gave up already: fine.
  (void)send_exact(peer.get(), bytes.data(), bytes.size(), Clock::now() + kPatience);
  ::shutdown(peer.get(), SHUT_WR);
  RDMABUF_FUZZ_CHECK(connected.wait_for(kPatience) == std::future_status::ready);
  auto endpoint = connected.get();
  if (endpoint.ok()) {
    (*endpoint)->close();
    return;
  }
  const StatusCode code = endpoint.status().code();
  RDMABUF_FUZZ_CHECK(code == StatusCode::kProtocolError || code == StatusCode::kUnavailable);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> bytes(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    play_the_connecting_peer(bytes);
  } else {
    play_the_listener(bytes);
  }
  return 0;
}
