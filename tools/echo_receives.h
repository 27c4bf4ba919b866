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

#include <cstddef>
#include <deque>
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
    while (receives.posted_.size() < kPosted)
      RDMABUF_RETURN_IF_ERROR(receives.post_one());
    return receives;
  }

  // After a ping: posts again the receive the last echo took, and hands
  // over the oldest, whose wait gives the echo.
  Result<PendingReceive> next() {
    if (posted_.size() < kPosted) RDMABUF_RETURN_IF_ERROR(post_one());
    PendingReceive oldest = std::move(posted_.front());
    posted_.pop_front();
    return oldest;
  }

 private:
  EchoReceives(Endpoint& endpoint, const LocalMemory& pong) : endpoint_(&endpoint), pong_(&pong) {}

  Status post_one() {
    RDMABUF_ASSIGN_OR_RETURN(PendingReceive receive, endpoint_->post_receive(*pong_));
    posted_.push_back(std::move(receive));
    return Status::Ok();
  }

  Endpoint* endpoint_;
  const LocalMemory* pong_;
  std::deque<PendingReceive> posted_;  // oldest first
};

}  // namespace rdmabuf::tool
