// How the manager begins endpoints (Manager::listen, Manager::connect): the
// listening socket an EndpointListener accepts on, and the connecting side's
// whole handshake. listener.cc has EndpointListener itself.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/socket.h"
#include "core/endpoint/endpoint_host.h"
#include "core/endpoint/handshake.h"
#include "rdmabuf/endpoint.h"

namespace rdmabuf {

class EndpointImpl;

struct EndpointListener::State {
  State(endpoint::EndpointHost& h, Fd listening, HostPort bound, Fd stopped)
      : host(h), fd(std::move(listening)), address(std::move(bound)), stop(std::move(stopped)) {}
  endpoint::EndpointHost& host;
  Fd fd;
  HostPort address;
  Fd stop;  // an eventfd, readable once closed
  std::atomic<bool> closed{false};
  // Handshakes under way when an accept returned, oldest first: the next
  // accept goes on with them (each within its own limit), so that short
  // accepts in a loop refuse no slow peer.
  std::mutex mu;
  std::vector<endpoint::AcceptingHandshake> unfinished;
};

namespace endpoint {

// The state of a listener bound to `address` ("HOST:PORT", port 0: any).
// kInvalidArgument for a malformed address, kUnavailable when it cannot be
// bound.
Result<std::unique_ptr<EndpointListener::State>> listen_for_endpoints(EndpointHost& host,
                                                                      const std::string& address);

// An endpoint to the listener at `address`, its handshake done within
// `timeout`.
Result<std::shared_ptr<EndpointImpl>> connect_endpoint(EndpointHost& host,
                                                       const std::string& address,
                                                       std::chrono::milliseconds timeout);

}  // namespace endpoint
}  // namespace rdmabuf
