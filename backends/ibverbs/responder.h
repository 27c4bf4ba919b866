// The owner side of the ibverbs backend: its end of one reader's queue pair,
// served as a session on the manager's I/O threads (common/io_pool.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "backends/ibverbs/device.h"
#include "backends/ibverbs/notice_intake.h"
#include "backends/ibverbs/remote_access.h"
#include "common/io_pool.h"
#include "common/socket.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::ibverbs {

struct ResponderContext {
  const Device* device = nullptr;
  BufferResolver* resolver = nullptr;
  // Opens buffers to the pair, for readers that present their handles.
  RemoteAccess* access = nullptr;
  // Takes the notices that arrive on the pair's receives.
  std::shared_ptr<NoticeIntake> intake;
  // The manager id the reader's hello claimed.
  uint64_t reader_id = 0;
  // Backend-wide shutdown.
  const std::atomic<bool>* stopping = nullptr;
  ResponderCounts* counts = nullptr;
};

// Serves one reader over `fd` (its ibverbs handshake connection, after the
// hello), on whichever I/O thread finds the socket ready, without waiting
// on it: reads the reader's request and creates the owner's side of the
// reader's queue pair, if the reader presents a handle of this owner's (its
// id, token and size), and keeps it while the reader keeps the connection
// open; meanwhile answers the reader's requests for access to buffers, each
// with a key that works on this pair alone (remote_access.h). The pair's
// receives take the notices of the reader's tagged writes, through the
// intake (notice_intake.h). The access it granted ends with the pair. A
// pair that failed takes no more notices, but the reader's questions are
// still answered: a reader whose access was refused (which fails this side
// of the pair too) asks whether the buffer was released before it lets go
// (Connection::explain). Ends when the reader closes the connection, sends
// anything malformed, takes longer than 10 s over its request (or over
// reading an answer), or the backend stops.
std::unique_ptr<IoSession> open_responder(Fd fd, ResponderContext context);

}  // namespace rdmabuf::ibverbs
