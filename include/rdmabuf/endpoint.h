// Endpoints: a connection between two managers for two-sided messages, in
// the style of async-rdma's send/receive, built on one-sided writes.
//
//   auto listener = manager.listen("127.0.0.1:0");      // the receiving side
//   auto ep = (*listener)->accept(timeout);
//   auto size = (*ep)->receive(into, timeout);          // the next message
//
//   auto ep = other_manager.connect(address, timeout);  // the sending side
//   Status st = (*ep)->send(message, timeout);
//
// How a message moves: receive() registers its memory with the manager and
// posts the handle to the peer over the endpoint's control connection (a
// credit); send() takes the oldest credit, writes the message into that
// memory with an ordinary one-sided write (so it travels over the best
// transport the two managers share, with the same backend choice, fallback
// and reasons as every other op), then tells the receiver its size.
//
// Guarantees:
// - Message boundaries: one send fills one receive; its size is returned.
// - Order: messages arrive in the order their sends took credits (the
//   order of send() calls from one thread). Receives are filled in the
//   order they were posted.
// - Flow control: a send waits until the peer has posted a receive, so a
//   sender never overruns the receiver.
// - A message larger than the posted receive fails both calls with
//   kInvalidArgument; nothing is truncated.
// - A receive that times out is withdrawn: its memory is released first, so
//   no byte lands in it afterwards, and a message already on its way either
//   landed (and the receive returns it, late) or goes to the next receive.
// - A peer that closes or dies fails every waiting call with kUnavailable;
//   malformed control bytes close the endpoint with kProtocolError.
//
// The manager must outlive its endpoints and listeners.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf {

class Manager;
class EndpointImpl;

class Endpoint {
 public:
  ~Endpoint();  // close()
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Sends `message` (its bytes, possibly none) as one message and returns
  // once it is in the receive buffer the peer posted for it. Waits for such
  // a receive. kInvalidArgument when the message is larger than that buffer
  // (the peer's receive fails too); kDeadlineExceeded when no receive was
  // posted in time, or the write did not finish (then the peer's receive
  // does not see it); kUnavailable when the endpoint broke. Thread-safe.
  Status send(const LocalMemory& message, std::chrono::milliseconds timeout);

  // Posts `into` for the next message and waits for it: its size.
  // kInvalidArgument when the message was larger than `into` (the sender's
  // send fails too; `into` holds nothing of it); kDeadlineExceeded when no
  // message came in time; kUnavailable when the endpoint broke. `into` must
  // stay valid until the call returns. Thread-safe.
  Result<uint64_t> receive(const LocalMemory& into, std::chrono::milliseconds timeout);

  // The peer's "HOST:PORT", as this side sees it.
  std::string peer() const;

  // Closes the connection: waiting calls fail with kCancelled, the peer's
  // with kUnavailable. Idempotent.
  void close();

 private:
  friend class Manager;
  friend class EndpointListener;
  explicit Endpoint(std::unique_ptr<EndpointImpl> impl);
  std::unique_ptr<EndpointImpl> impl_;
};

class EndpointListener {
 public:
  ~EndpointListener();
  EndpointListener(const EndpointListener&) = delete;
  EndpointListener& operator=(const EndpointListener&) = delete;

  // The next endpoint a peer connected (Manager::connect), once its
  // greeting checked out. kDeadlineExceeded when none came in time;
  // kProtocolError for a peer that is not an rdmabuf endpoint (it is
  // dropped; call again for the next).
  Result<std::unique_ptr<Endpoint>> accept(std::chrono::milliseconds timeout);

  // "HOST:PORT" to give to Manager::connect (the port chosen when 0).
  std::string address() const;

 private:
  friend class Manager;
  struct State;
  explicit EndpointListener(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace rdmabuf
