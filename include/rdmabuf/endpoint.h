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
// How a message moves: receive() posts a credit to the peer over the
// endpoint's control connection; send() takes the oldest credit. A message
// of up to 4 KiB travels inside a control frame. A larger one travels in
// parts through the control channel where that is the better way (through
// shared memory between two managers on one host, always; over TCP, up to
// 64 KiB, when the sender has no RDMA backend). Otherwise it is written
// into the receive's memory with an ordinary one-sided write (so it travels
// over the best transport the two managers share, with the same backend
// choice, fallback and reasons as every other op), then the receiver is
// told its size. For that the receive registers its memory with the
// manager: when posted, while the messages lately were written so, and
// otherwise when the sender asks for it. Control frames travel through
// shared memory between two managers on one host, as verbs SEND/RECV
// between two managers with RDMA NICs, or over TCP (see channel()).
//
// Guarantees:
// - Message boundaries: one send fills one receive; its size is returned.
// - Order: messages arrive in the order their sends took credits (the
//   order of send() or post_send() calls from one thread). Receives are
//   filled in the order they were posted.
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
// Beyond messages, an endpoint carries:
// - Handles: send_buffer() / receive_buffer() pass a RemoteBuffer, in order.
// - Lent memory: request_remote_buffer() asks the peer's manager to lend
//   memory (allocated and registered for the purpose, within the lender's
//   Config::lend_limit) for a lease. When the lease ends, unless renew()ed,
//   the lender releases it: from then on every access fails with kNotFound.
//   Sending the lent handle back with send_buffer() returns the memory: the
//   lender's receive_local_buffer() gives it that memory, with what the
//   borrower wrote, and the borrower's access ends.
// - Notifications: write() is a one-sided write that carries a 32-bit tag;
//   once its bytes have landed, the owner's manager gets a Notification
//   (Manager::next_notification, or its handler).
//
// The manager must outlive its endpoints and listeners.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "rdmabuf/buffer.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf {

class Manager;
class EndpointImpl;

// A receive posted with Endpoint::post_receive, not yet waited for. Move-only.
// (Moves and the destructor of one waited for are inline: a receive is
// posted, moved and dropped on every message's path.)
class PendingReceive {
 public:
  PendingReceive() = default;
  PendingReceive(PendingReceive&& other) noexcept
      : endpoint_(std::move(other.endpoint_)), seq_(other.seq_) {}
  PendingReceive& operator=(PendingReceive&& other) noexcept {
    if (this != &other) {
      if (endpoint_) withdraw();
      endpoint_ = std::move(other.endpoint_);
      seq_ = other.seq_;
    }
    return *this;
  }
  // Withdraws the receive when it was not waited for: from then on no byte
  // lands in its memory, and a message that landed in it already is dropped.
  // So may be one the peer sent before the withdrawal reached it (its send
  // succeeded). To keep such a message, wait with a short timeout instead:
  // a timed-out wait returns a message that crossed its withdrawal.
  ~PendingReceive() {
    if (endpoint_) withdraw();
  }

  // Waits for the message: its size. Errors as Endpoint::receive's, and
  // kFailedPrecondition on a second call. At the deadline the receive is
  // withdrawn, as receive()'s is.
  Result<uint64_t> wait(std::chrono::milliseconds timeout);

 private:
  friend class Endpoint;
  PendingReceive(std::shared_ptr<EndpointImpl> endpoint, uint64_t seq)
      : endpoint_(std::move(endpoint)), seq_(seq) {}
  // The receive, not waited for, is given up (endpoint_ set).
  void withdraw();
  std::shared_ptr<EndpointImpl> endpoint_;  // empty once waited for
  uint64_t seq_ = 0;
};

// A send posted with Endpoint::post_send, not yet waited for. Move-only.
// (Moves and the destructor of one waited for are inline, as
// PendingReceive's.)
class PendingSend {
 public:
  PendingSend() = default;
  PendingSend(PendingSend&& other) noexcept
      : endpoint_(std::move(other.endpoint_)),
        id_(other.id_),
        waited_(std::exchange(other.waited_, true)),
        done_(std::move(other.done_)) {}
  PendingSend& operator=(PendingSend&& other) noexcept {
    if (this != &other) {
      if (endpoint_) cancel();
      endpoint_ = std::move(other.endpoint_);
      id_ = other.id_;
      waited_ = std::exchange(other.waited_, true);
      done_ = std::move(other.done_);
    }
    return *this;
  }
  // Cancels the send when it was not waited for, as a wait that times out
  // at once does: once this returns, the library no longer reads the
  // message's memory.
  ~PendingSend() {
    if (endpoint_) cancel();
  }

  // Waits until the message is in the peer's receive (or failed). Errors as
  // Endpoint::send's, and kFailedPrecondition on a second call. At the
  // deadline the send is cancelled: a message no receive took yet is not
  // sent, and a one-sided write under way is cut short (the peer's receive
  // then does not see it, and takes the next message).
  Status wait(std::chrono::milliseconds timeout);

 private:
  friend class Endpoint;
  PendingSend(std::shared_ptr<EndpointImpl> endpoint, uint64_t id)
      : endpoint_(std::move(endpoint)), id_(id), waited_(false) {}
  explicit PendingSend(Status done) : waited_(false), done_(std::move(done)) {}
  // The send, not waited for, is cancelled (endpoint_ set).
  void cancel();
  std::shared_ptr<EndpointImpl> endpoint_;  // empty once finished
  uint64_t id_ = 0;
  bool waited_ = true;  // wait() was called, or there is nothing to wait for
  Status done_;         // the outcome, when it was known when posted
};

// A tagged write (Endpoint::write) that has landed in this manager's memory.
// The peer says what it wrote; the bytes were in place before it said so.
struct Notification {
  uint32_t tag = 0;
  uint64_t buffer_id = 0;  // RemoteBuffer::id() of the buffer written
  uint64_t offset = 0;     // the range written, within the registered buffer
  uint64_t length = 0;
  std::string peer;  // the endpoint's peer, "HOST:PORT"
};

// Memory a peer lent (Endpoint::request_remote_buffer).
struct Lease {
  RemoteBuffer buffer;
  // How long the lender granted, from when it answered: at most what was
  // asked, and at most its Config::max_lease.
  std::chrono::milliseconds granted{0};
};

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

  // send() in two steps: posts `message` now, and the outcome comes with
  // PendingSend::wait, so that one thread can keep several messages in
  // flight. Posted sends take the peer's receives in the order they were
  // posted. A message of up to 4 KiB goes out at once when the peer has a
  // receive posted; others move on whenever this endpoint is used (a post,
  // a wait, a receive) or its server runs, with no caller needed, and a
  // large message's one-sided write runs meanwhile, bounded by
  // Config::default_timeout. `message` must stay valid and unchanged until
  // the wait returns or the PendingSend is gone. A send whose receive was
  // withdrawn goes to the next receive, and may then land after messages
  // posted later.
  Result<PendingSend> post_send(const LocalMemory& message);

  // Posts `into` for the next message and waits for it: its size.
  // kInvalidArgument when the message was larger than `into` (the sender's
  // send fails too; `into` holds nothing of it); kDeadlineExceeded when no
  // message came in time; kUnavailable when the endpoint broke. `into` must
  // stay valid until the call returns. After a failure its bytes are
  // unspecified: a message cut short (a dead sender, a deadline) may have
  // partly landed. Thread-safe.
  Result<uint64_t> receive(const LocalMemory& into, std::chrono::milliseconds timeout);

  // receive() in two steps: posts `into` now, and the message comes with
  // PendingReceive::wait. Receives are filled in the order they were
  // posted, so a receiver can keep several posted and wait for them in
  // turn, with no thread per receive. The receive's credit (what lets the
  // peer send into it) goes out with this side's next frame (a send()
  // right after travels in the same packet); or when this side next waits
  // on the endpoint, through shared memory whenever the wait finds nothing
  // to take, over TCP or RDMA only once the peer has no more credits left
  // than this side holds back (a peer with older receives still to fill
  // does not need it yet: an echo sent before the receive is posted again
  // takes the credit along with the next echo); and otherwise within about
  // a millisecond (up to 8 ms right after a stretch of calls on the
  // endpoint). `into` must stay valid until the wait returns or the
  // PendingReceive is gone.
  Result<PendingReceive> post_receive(const LocalMemory& into);

  // A one-sided write of `src` into `dst` (a buffer of the peer's manager)
  // that carries `tag`: once the bytes have landed, the peer's manager gets
  // a Notification. Over ibverbs the notice follows the bytes on the same
  // queue pair (the owner hears of them one way after they landed); over
  // the other transports a frame follows the finished write. The op's
  // status: kInvalidArgument when `dst` is not the peer's; the write's own
  // errors; kUnavailable when the endpoint broke before the notification
  // was sent, or when the queue pair failed with the notice in flight
  // (the bytes, and the notification, may then have landed). OK: the
  // notification was sent (over ibverbs, the owner's NIC took it).
  Status write(const RemoteBuffer& dst, const LocalMemory& src, uint32_t tag,
               std::chrono::milliseconds timeout);

  // Asks the peer to lend `size` bytes for `lease`. kResourceExhausted when
  // the peer's lend limit would be passed; kInvalidArgument for size 0.
  Result<Lease> request_remote_buffer(uint64_t size, std::chrono::milliseconds lease,
                                      std::chrono::milliseconds timeout);
  // Extends the lease of `lent` (a buffer this side borrowed from the peer)
  // to `lease` from now (at most the lender's max): what was granted.
  // kNotFound when the lease has ended already.
  Result<std::chrono::milliseconds> renew(const RemoteBuffer& lent, std::chrono::milliseconds lease,
                                          std::chrono::milliseconds timeout);

  // Passes a handle to the peer, in order with the other handles.
  Status send_buffer(const RemoteBuffer& buffer, std::chrono::milliseconds timeout);
  // The next handle the peer passed that is not memory this side lent.
  Result<RemoteBuffer> receive_buffer(std::chrono::milliseconds timeout);
  // The next handle the peer passed back that is memory this side lent to
  // it: that memory (the range of the handle), now this side's alone again.
  Result<LocalMemory> receive_local_buffer(std::chrono::milliseconds timeout);

  // The peer's "HOST:PORT", as this side sees it.
  std::string peer() const;

  // How the endpoint's frames (credits, small messages, answers,
  // notifications) travel: "shared memory" (rings both processes map, when
  // the managers share a host and each has its memory backend viable);
  // else "ibverbs (DEVICE, SEND/RECV)" (verbs SENDs into receives the peer
  // keeps posted, when both managers have an RDMA backend viable); else
  // "tcp (shared memory: WHY; RDMA: WHY)", each reason said by "this side"
  // or "the peer". Large messages and tagged writes move by one-sided
  // writes either way.
  std::string channel() const;

  // Closes the connection: waiting calls fail with kCancelled, the peer's
  // with kUnavailable. Idempotent.
  void close();

 private:
  friend class Manager;
  friend class EndpointListener;
  explicit Endpoint(std::shared_ptr<EndpointImpl> impl);
  std::shared_ptr<EndpointImpl> impl_;  // shared with its PendingReceives and PendingSends
};

class EndpointListener {
 public:
  ~EndpointListener();
  EndpointListener(const EndpointListener&) = delete;
  EndpointListener& operator=(const EndpointListener&) = delete;

  // The next endpoint a peer connected (Manager::connect), once its
  // greeting checked out. A connection that fails the handshake (not an
  // rdmabuf endpoint, gone midway, or not done within 5 s) is dropped with
  // a warning in the log, and accept goes on waiting: its errors are about
  // the listener, never one peer. Handshakes go on side by side (up to 64
  // at once), so a silent connection holds up no other. kDeadlineExceeded
  // when no peer completed the handshake in time; the handshakes still
  // under way then are kept for the next accept, each within its own 5 s,
  // so short accepts in a loop refuse no slow peer. (A frame a peer has
  // begun is read whole first: an accept may overrun its timeout by that.)
  // kCancelled once close() was called, which also drops the handshakes
  // kept; kUnavailable when the listening socket itself fails.
  Result<std::unique_ptr<Endpoint>> accept(std::chrono::milliseconds timeout);

  // "HOST:PORT" to give to Manager::connect (the port chosen when 0).
  std::string address() const;

  // Stops listening: later connects are refused, and accept() (one waiting
  // in another thread too) returns kCancelled. Thread-safe, idempotent.
  // Endpoints already accepted are not affected.
  void close();

  // Its state (opaque: the library's own).
  struct State;

 private:
  friend class Manager;
  explicit EndpointListener(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace rdmabuf
