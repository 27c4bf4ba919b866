// Fuzzes what an endpoint reads from its peer once the handshake is done:
// the control frames of core/endpoint/frames.cc (docs/wire-format.md, "Endpoint
// control frames").
//
// Each input is the byte stream a peer sends after a correct hello and a
// channel offer that declines shared memory and RDMA (tests/helpers/raw_endpoint.h
// plays that peer), to a real Endpoint of a real Manager that has posted
// two receives, one that only inline messages fit (64 B) and one that
// registers its memory (8 KiB). Then the peer's stream ends.
//
// Checks: nothing crashes or touches memory it should not (AddressSanitizer);
// each receive ends, within its timeout, either with a message no larger
// than its buffer or with one of the errors a peer can cause (ProtocolError,
// Unavailable, InvalidArgument for a message too large, DeadlineExceeded for
// one not taken); and once the endpoint is closed the manager holds no
// registration (lent memory and registered receives are all released).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "fuzz/fuzz_support.h"
#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/raw_endpoint.h"

namespace {

using namespace rdmabuf;
using rdmabuf::testing::RawEndpointPeer;

struct Fixture {
  std::unique_ptr<Manager> manager;
  std::unique_ptr<EndpointListener> listener;
};

Fixture& fixture() {
  static Fixture f = [] {
    Config config;
    config.backends = {"tcp"};
    config.listen_address = "127.0.0.1:0";
    config.lend_limit = 1 << 20;  // loans the input asks for stay small
    Fixture made;
    auto manager = Manager::create(config);
    RDMABUF_FUZZ_CHECK(manager.ok());
    made.manager = std::move(manager).value();
    auto listener = made.manager->listen("127.0.0.1:0");
    RDMABUF_FUZZ_CHECK(listener.ok());
    made.listener = std::move(listener).value();
    return made;
  }();
  return f;
}

bool a_peer_may_cause(StatusCode code) {
  switch (code) {
    case StatusCode::kProtocolError:      // malformed or lying frames
    case StatusCode::kUnavailable:        // the stream ended
    case StatusCode::kInvalidArgument:    // "too large"
    case StatusCode::kDeadlineExceeded:   // "not taken"
    case StatusCode::kResourceExhausted:  // handles passed and not taken
      return true;
    default:
      return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace std::chrono_literals;
  Fixture& f = fixture();
  auto raw = RawEndpointPeer::start(f.listener->address(), /*manager_id=*/0xf022);
  RDMABUF_FUZZ_CHECK(raw.has_value());
  auto accepted = f.listener->accept(10s);
  RDMABUF_FUZZ_CHECK(accepted.ok());
  RDMABUF_FUZZ_CHECK(raw->finish(10s));
  std::unique_ptr<Endpoint> endpoint = std::move(accepted).value();

  auto small = LocalMemory::allocate(64);
  auto large = LocalMemory::allocate(8192);
  RDMABUF_FUZZ_CHECK(small.ok() && large.ok());
  std::optional<PendingReceive> receives[2];
  for (int i = 0; i < 2; ++i) {
    auto posted = endpoint->post_receive(i == 0 ? *small : *large);
    RDMABUF_FUZZ_CHECK(posted.ok());
    receives[i] = std::move(posted).value();
  }
  raw->send(std::span<const uint8_t>(data, size));  // a refused send is fine: the endpoint closed
  raw->shut_down_writes();

  for (int i = 0; i < 2; ++i) {
    const uint64_t capacity = i == 0 ? small->size() : large->size();
    auto got = receives[i]->wait(20s);
    if (got.ok()) {
      RDMABUF_FUZZ_CHECK(*got <= capacity);
    } else {
      RDMABUF_FUZZ_CHECK(a_peer_may_cause(got.status().code()));
    }
  }
  endpoint.reset();
  // Notifications the input made: taken, so that the queue never fills.
  while (f.manager->next_notification(0ms).ok()) {
  }
  RDMABUF_FUZZ_CHECK(f.manager->registered_count() == 0);
  return 0;
}
