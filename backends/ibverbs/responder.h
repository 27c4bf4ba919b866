// The owner side of the ibverbs backend: its end of one reader's queue pair,
// and the thread (Backend::serve_connection) that keeps it.
#pragma once

#include <atomic>
#include <cstdint>

#include "backends/ibverbs/device.h"
#include "backends/ibverbs/remote_access.h"
#include "common/socket.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::ibverbs {

// What the owner's side of the pairs counts, for BackendInfo.
struct ResponderCounts {
  std::atomic<int> live{0};             // pairs held for readers now
  std::atomic<uint64_t> handshakes{0};  // ever served
  std::atomic<uint64_t> notices{0};     // handed to the sink and taken
  std::atomic<uint64_t> refused{0};     // dropped: malformed, or refused by the sink
};

struct ResponderContext {
  const Device* device = nullptr;
  BufferResolver* resolver = nullptr;
  // Opens buffers to the pair, for readers that present their handles.
  RemoteAccess* access = nullptr;
  // Takes the notices readers send (null: each is refused).
  NoticeSink* notices = nullptr;
  // The manager id the reader's hello claimed.
  uint64_t reader_id = 0;
  // Backend-wide shutdown: the flag, and the eventfd that wakes the poll.
  const std::atomic<bool>* stopping = nullptr;
  int stop_fd = -1;
  ResponderCounts* counts = nullptr;
};

// Serves one reader over `fd` (its ibverbs handshake connection, after the
// hello): creates the owner's side of the reader's queue pair, if the
// reader presents a handle of this owner's (its id, token and size), and
// keeps it while the reader keeps the connection open; meanwhile answers
// the reader's requests for access to buffers, each with a key that works
// on this pair alone (remote_access.h), and takes the notices of its tagged
// writes (handshake.h, "notice"). The access it granted ends with the pair.
//
// Notices come as SENDs into kNoticeReceives receives kept posted on this
// side of the pair. Each goes to the sink as it completes; one the sink has
// no room for now is kept, with those after it, in order, and offered
// again every few milliseconds; their receives are posted again only once
// the sink took them, so a reader that outruns the owner's application is
// held back by its NIC (receiver not ready, retried without end), and no
// notice is lost. A malformed one is dropped, counted and logged (once a pair);
// a SEND too large for a receive fails the pair, which the reader then
// sets up again. A failed pair (so does an access the owner's NIC refused)
// takes no more notices, but the reader's questions are still answered.
// Returns when the reader closes the connection, or on shutdown.
void serve_responder(Fd fd, const ResponderContext& context);

}  // namespace rdmabuf::ibverbs
