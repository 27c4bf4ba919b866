// Manager: one per process (more are allowed). Mints handles to local
// memory, serves peers' accesses to it, and runs this process's transfers.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmabuf/backend.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/config.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/op.h"
#include "rdmabuf/status.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

class ManagerImpl;
class Endpoint;
class EndpointListener;
struct Notification;

// Thread safety: every method may be called from any thread, concurrently.
// Destroying the manager shuts it down (see shutdown()).
class Manager {
 public:
  // Starts a manager: validates `config`, creates every enabled backend that
  // is viable here (the others are listed by backends() with the reason),
  // and starts listening on config.listen_address. kInvalidArgument for a
  // bad config; kUnavailable when the address cannot be bound.
  static Result<std::unique_ptr<Manager>> create(const Config& config);
  // The same with Config::from_env().
  static Result<std::unique_ptr<Manager>> create();

  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  const Config& config() const;
  // Who this manager is, as written into the handles it mints.
  const PeerIdentity& identity() const;
  // "HOST:PORT" peers dial (identity().address).
  const std::string& address() const;

  // Every backend rdmabuf knows, in priority order, with viability and the
  // reason when not viable or not enabled.
  std::vector<BackendInfo> backends() const;

  // Registers `memory` and mints a handle to it: a new id, a fresh random
  // token, one context per backend that accepted the memory. The manager
  // holds memory.keepalive() until the buffer is released.
  // kInvalidArgument for empty memory; kFailedPrecondition after shutdown.
  Result<RemoteBuffer> register_buffer(LocalMemory memory);

  // Unregisters the buffer behind `handle` (any slice of it). Returns once no
  // access by any peer is in flight and every backend has stopped serving
  // it; from then on every access through any handle to it fails with
  // kNotFound, and the memory may be freed (the manager drops its copy of
  // the keepalive last, after every backend). An access that has not
  // finished after a grace period of 1 s is aborted: a stalled tcp peer's
  // connection is shut down, and a same-host reader stopped inside its copy
  // (SIGSTOP, a debugger) has the copy cancelled, failing its op with
  // kNotFound (docs/security.md, "Release").
  // kNotFound when unknown or already released; kInvalidArgument when the
  // handle was minted by another manager.
  Status release(const RemoteBuffer& handle);

  // Buffers currently registered. A buffer being released counts until its
  // release() has returned, so once the count drops, every access to it
  // fails with kNotFound on every backend.
  size_t registered_count() const;

  // The transport an op on `remote` would take if submitted now ("memory",
  // "ibverbs", "tcp"): the best one both sides offer that reaches the owner,
  // as submit() chooses it (an op whose local memory that transport cannot
  // take may still go to the next). When none can carry it, the status
  // submit() would fail the op with. Moves no bytes; may connect to the
  // owner's host to learn whether it is this one.
  Result<std::string> transport_for(const RemoteBuffer& remote);

  // Starts `ops` and returns at once. Each op goes to the best transport
  // both sides offer; ops to different peers run concurrently, ops to one
  // peer are pipelined. An op that breaks the size rules (see Op) or names
  // an empty handle fails alone with kInvalidArgument before any byte moves;
  // the others go on. `timeout` bounds the whole transfer (see Transfer).
  Transfer submit(std::vector<Op> ops, std::chrono::milliseconds timeout);

  // The same, and `on_done` runs exactly once when the transfer finishes:
  // every op done or failed, cancelled, or the deadline passed. The manager
  // enforces the deadline of such a transfer itself, so `on_done` fires on
  // time even when nobody waits. It runs on a library thread (or, for a
  // transfer that fails at once, inside this call): keep it short and never
  // block in it; reading the Transfer's statuses from it is fine.
  // Transfer::wait, cancel and the destructor return only after on_done
  // has returned (except when called from inside on_done).
  Transfer submit(std::vector<Op> ops, std::chrono::milliseconds timeout,
                  std::function<void()> on_done);

  // Blocking conveniences for one op; `timeout` defaults to
  // config().default_timeout. They return the op's status.
  Status read_into(const RemoteBuffer& src, const LocalMemory& dst,
                   std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  Status write_from(const RemoteBuffer& dst, const LocalMemory& src,
                    std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Endpoints (rdmabuf/endpoint.h): two-sided messages with another
  // manager. listen() binds "HOST:PORT" (port 0: any) for peers to
  // connect() to; kInvalidArgument for a malformed address, kUnavailable
  // when it cannot be bound or reached, kDeadlineExceeded, kProtocolError
  // when the other side is not an rdmabuf endpoint. This manager must
  // outlive what they return.
  Result<std::unique_ptr<EndpointListener>> listen(const std::string& address);
  Result<std::unique_ptr<Endpoint>> connect(const std::string& address,
                                            std::chrono::milliseconds timeout);

  // The next Notification of a tagged write (Endpoint::write) into this
  // manager's memory, oldest first. kDeadlineExceeded when none came in
  // time; kFailedPrecondition after shutdown. While none is queued it
  // spins for Config::busy_poll, reading the endpoints' channels itself
  // when no other thread does (the notification frames of writes over
  // memory and TCP reach it with no hand-over between threads), then
  // sleeps while the endpoints' servers read.
  Result<Notification> next_notification(std::chrono::milliseconds timeout);
  // Hands notifications to `handler` instead of queueing them (empty: queue
  // again). It runs on a library thread (an endpoint worker, or over
  // ibverbs the manager's notice thread), one notification at a time per peer (over
  // ibverbs, one at a time for all peers): keep it short; while it runs,
  // the later notifications, and their writers, wait. Returns once no call
  // of the handler it replaces is under way, so what that handler uses may
  // go then; do not call it holding what a running handler waits for.
  // Called from a handler, or from a transfer's on_done, it returns at once
  // (a call under way may be waiting for the caller).
  void set_notification_handler(std::function<void(const Notification&)> handler);

  // Stops serving and transferring: closes the listener and every
  // connection, fails in-flight ops with kCancelled, releases every buffer.
  // Idempotent. Later calls fail with kFailedPrecondition.
  void shutdown();

 private:
  explicit Manager(std::unique_ptr<ManagerImpl> impl);
  std::unique_ptr<ManagerImpl> impl_;
};

}  // namespace rdmabuf
