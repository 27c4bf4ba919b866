// The receives a ping-pong's client keeps posted for the echoes, shared by
// `rdmabuf bench --op send` (tools/bench_send.cc) and rdmabuf_ping_pong,
// which must measure the same pattern: kPosted receives into one buffer,
// as many as `rdmabuf serve --endpoint` keeps for the pings (and as
// ib_send_lat keeps its receive queue full). Each trip sends its ping,
// then takes next(): the receive the last echo took is posted again there,
// after the ping and not between an echo and it, and the oldest is handed
// over for its wait. Over TCP or RDMA that receive's credit waits for the
// next ping to carry it (the peer still holds the others':
// Endpoint::post_receive); through shared memory it goes while the client
// waits.
#pragma once

#include <array>
#include <cstddef>
#include <utility>

#include "rdmabuf/rdmabuf.h"

namespace rdmabuf::tool {

class EchoReceives {
 public:
  static constexpr size_t kPosted = 16;

  // Posts kPosted receives into `pong` (each echo lands there, one at a
  // time: the next comes only after the next ping). `endpoint` and `pong`
  // must outlive the value.
  static Result<EchoReceives> post(Endpoint& endpoint, const LocalMemory& pong) {
    EchoReceives receives(endpoint, pong);
    for (size_t place = 0; place < kPosted; ++place)
      RDMABUF_RETURN_IF_ERROR(receives.post_into(place));
    return receives;
  }

  // After a ping: posts again the receive the last echo took, and hands
  // over the oldest, whose wait gives the echo.
  Result<PendingReceive> next() {
    if (handed_over_) {
      // The place just before the oldest: the newest in the ring.
      RDMABUF_RETURN_IF_ERROR(post_into((oldest_ + kPosted - 1) % kPosted));
    }
    handed_over_ = true;
    const size_t oldest = oldest_;
    oldest_ = (oldest_ + 1) % kPosted;
    return std::move(ring_[oldest]);
  }

 private:
  EchoReceives(Endpoint& endpoint, const LocalMemory& pong) : endpoint_(&endpoint), pong_(&pong) {}

  Status post_into(size_t place) {
    RDMABUF_ASSIGN_OR_RETURN(ring_[place], endpoint_->post_receive(*pong_));
    handed_over_ = false;
    return Status::Ok();
  }

  Endpoint* endpoint_;
  const LocalMemory* pong_;
  // The posted receives, in the order they were posted from oldest_ on
  // round the ring; while handed_over_, the place just before oldest_
  // held the receive handed over last, and is posted again next. A ring,
  // not a std::deque: the deque's pushes and pops cost the ping-pong's
  // client 67 instructions a round trip, a twentieth of its whole count
  // through shared memory.
  std::array<PendingReceive, kPosted> ring_;
  size_t oldest_ = 0;
  bool handed_over_ = false;
};

}  // namespace rdmabuf::tool
