// Backend: one transport (tcp, ibverbs, memory) behind one small interface,
// and the contracts between a backend and the manager that drives it.
//
// Most users never touch this header beyond BackendInfo; it is public so the
// contracts are written down in one place, and so new transports can be
// added by implementing Backend (see docs/adding-a-backend.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rdmabuf/buffer.h"
#include "rdmabuf/config.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/op.h"
#include "rdmabuf/status.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

// How good a transport is; the manager uses the highest level that both it
// and the buffer's owner offer.
enum class TransportLevel : uint8_t { kTcp = 1, kNic = 2, kMemory = 3 };

// "tcp", "nic", "memory".
const char* transport_level_name(TransportLevel level);

// What `rdmabuf info` and Manager::backends() show for one backend.
class IoSession;    // common/io_pool.h
class SharedLoops;  // common/event_loop.h

struct BackendInfo {
  std::string name;
  TransportLevel level = TransportLevel::kTcp;
  bool viable = false;
  // Why it is not viable (or not enabled); empty when viable.
  std::string reason;
  // Backend-specific facts ("devices", "streams", ...), for display.
  std::vector<std::pair<std::string, std::string>> details;
};

// ---------------------------------------------------------------------------
// The reader side: a batch of ops, shared by the manager (which created it),
// the Transfer handle (which waits on it) and the backends (which run it).

// What a tagged write (Endpoint::write) asks of the backend that carries it:
// to tell the owner once every byte has landed. `endpoint_key` names the
// owner's endpoint whose Notification it becomes (its peer, as a frame's
// would have); it is the random key that endpoint sent in its hello, so a
// notice is believed only from a peer that endpoint talked to.
struct WriteNotice {
  uint32_t tag = 0;
  uint64_t endpoint_key = 0;
};

class TransferState {
 public:
  // The deadline is `timeout` from now (saturating, see deadline_after);
  // DeadlineExceeded names `timeout` as given. `busy_poll`: how long
  // wait_until spins before it sleeps.
  TransferState(std::vector<Op> ops, std::chrono::milliseconds timeout,
                std::chrono::microseconds busy_poll);
  TransferState(const TransferState&) = delete;
  TransferState& operator=(const TransferState&) = delete;
  ~TransferState();

  size_t op_count() const { return op_count_; }
  const Op& op(size_t index) const { return ops_[index]; }
  Deadline deadline() const { return deadline_; }

  // --- For backends -------------------------------------------------------

  // Declares that op `index` will be completed in `parts` pieces (chunks),
  // each reported with complete_part. Call before the first complete_part of
  // that op; the default is one part.
  void expect_parts(size_t index, uint32_t parts);

  // Reports that one part of op `index` finished with `status`. The op
  // finishes with its first non-OK part status (or OK) once all parts are in.
  // Calls after the transfer was cancelled are accepted and ignored. Every
  // part must be reported exactly once, including on shutdown and on error.
  void complete_part(size_t index, const Status& status);

  // Local-memory guard. A backend brackets every access to the local memory
  // of this transfer's ops (a memcpy, a recv or send that reads or writes it)
  // with begin_touch()/end_touch(). begin_touch() returns false when the
  // transfer has been cancelled: the backend must then not touch the memory
  // (it drains incoming bytes elsewhere and completes the parts with any
  // status). Cheap: one atomic add each; safe from any number of threads.
  bool begin_touch() {
    uint32_t prev = guard_.fetch_add(1, std::memory_order_acq_rel);
    if (prev & kCancelledBit) {
      guard_.fetch_sub(1, std::memory_order_acq_rel);
      return false;
    }
    return true;
  }
  void end_touch() { guard_.fetch_sub(1, std::memory_order_acq_rel); }
  bool cancelled() const { return guard_.load(std::memory_order_acquire) & kCancelledBit; }

  // --- For the manager ----------------------------------------------------

  // Sets the function run exactly once when the transfer finishes (every op
  // done or failed, cancelled, or past its deadline), on whichever thread
  // finishes it (at once, on this thread, if it has finished already: a
  // transfer of no ops). Call before handing the transfer to any backend.
  void set_on_finish(std::function<void()> on_finish);

  // Records which backend runs op `index` and, when it is not the best the
  // owner offers, why. `backend` must outlive the transfer (a backend's
  // name, which is a string literal).
  void set_route(size_t index, std::string_view backend, const std::string& note);
  // Finishes op `index` at once (for ops rejected before reaching a backend).
  void fail_op(size_t index, const Status& status);
  // True while no part of op `index` has been reported: another backend may
  // still take the whole op (see OpRouter).
  bool no_part_reported(size_t index) const;
  // Asks that the owner be told once every byte of write op `index` has
  // landed (see WriteNotice). Before the transfer is handed to a backend.
  void set_notice(size_t index, const WriteNotice& notice);

  // --- Notices (tagged writes) ------------------------------------------------

  // The notice op `index` carries, or null. A backend that can send it
  // behind the bytes in one ordered stream to the owner (ibverbs: a SEND
  // after the WRITEs on the same queue pair, which the owner's NIC takes
  // only once they have landed) does so and calls mark_notice_sent before
  // it reports the op's last part; a backend that cannot ignores it, and
  // the endpoint tells the owner itself once the write has finished.
  const WriteNotice* notice(size_t index) const;
  void mark_notice_sent(size_t index);
  // Whether the backend that carried op `index` sent its notice: final once
  // the op has finished. When the op failed, the owner may have had the
  // notice all the same (it is sent only behind the bytes, which landed).
  bool notice_sent(size_t index) const;

  // --- For Transfer -------------------------------------------------------

  bool finished() const { return finished_.load(std::memory_order_acquire) != 0; }
  // Waits until finished or `until`; true when finished. Spins (yielding)
  // for the busy-poll window, then sleeps on a futex.
  bool wait_until(Deadline until);
  // Marks the transfer cancelled, waits until no backend is inside a
  // begin/end_touch bracket, fails every unfinished op with `code` and a
  // message naming the op and `why`, and finishes the transfer.
  void cancel(StatusCode code, std::string_view why);
  // Enforces the deadline: when it has passed and the transfer has not
  // finished, cancels with kDeadlineExceeded. True when finished afterwards.
  bool enforce_deadline();
  // Once finished: returns when the on_finish function has returned (at
  // once if there is none, or when called from inside it).
  void await_on_finish() const;

  Status status() const;
  Status op_status(size_t index) const;
  // Which backend carried op `index`, and why not a better one; final once
  // the op has finished (a backend may hand an op on before that).
  std::string_view op_backend(size_t index) const;
  std::string op_note(size_t index) const;

 private:
  static constexpr uint32_t kCancelledBit = 1u << 31;
  struct OpState;

  void record_error(size_t index, const Status& status);
  void finish_op();
  void publish();

  std::vector<Op> ops_;
  size_t op_count_ = 0;
  std::unique_ptr<OpState[]> states_;
  Deadline deadline_;
  std::chrono::microseconds busy_poll_;
  std::chrono::milliseconds timeout_;
  std::atomic<size_t> ops_left_{0};
  // kCancelledBit | number of backends inside a touch bracket.
  std::atomic<uint32_t> guard_{0};
  // 0 until every op has finished or the transfer was cancelled; a futex word.
  std::atomic<uint32_t> finished_{0};
  std::atomic<uint32_t> sleepers_{0};
  // Run by the thread whose publish() finishes the transfer, then dropped.
  std::function<void()> on_finish_;
  // 0: none; 1: set and not yet returned; 2: returned.
  std::atomic<uint32_t> on_finish_state_{0};
};

// ---------------------------------------------------------------------------
// The owner side: what a backend that serves accesses in software (tcp) asks
// of the manager that owns the buffers.

// Something release() can interrupt when it must not wait any longer, such as
// a connection blocked sending from a buffer to a peer that stopped reading.
class PinAbort {
 public:
  virtual ~PinAbort() = default;
  // Makes the holder's blocked I/O fail promptly (e.g. shutdown(2) of its
  // socket). Called from release(), on another thread; must not block.
  virtual void abort_pinned_io() = 0;
};

// A registered buffer held for an access. While it lives, release() of the
// buffer waits; after a grace period release() calls the holder's PinAbort
// (when it gave one) and keeps waiting. Move-only.
class PinnedRegion {
 public:
  using UnpinFn = void (*)(void* entry, PinAbort* abort);
  PinnedRegion() = default;
  // `memory`: the registered buffer, which the entry keeps alive.
  PinnedRegion(const LocalMemory& memory, void* entry, UnpinFn unpin, PinAbort* abort)
      : data_(memory.data()),
        size_(memory.size()),
        kind_(memory.kind()),
        device_(memory.device()),
        entry_(entry),
        unpin_(unpin),
        abort_(abort) {}
  PinnedRegion(PinnedRegion&& other) noexcept { *this = std::move(other); }
  PinnedRegion& operator=(PinnedRegion&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      kind_ = other.kind_;
      device_ = other.device_;
      entry_ = std::exchange(other.entry_, nullptr);
      unpin_ = std::exchange(other.unpin_, nullptr);
      abort_ = std::exchange(other.abort_, nullptr);
    }
    return *this;
  }
  ~PinnedRegion() { reset(); }

  bool held() const { return entry_ != nullptr; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Where the bytes are: GPU memory is reached through the CUDA driver only.
  MemoryKind kind() const { return kind_; }
  bool on_gpu() const { return kind_ == MemoryKind::kCuda; }
  int device() const { return device_; }
  void reset() {
    if (entry_) unpin_(entry_, abort_);
    entry_ = nullptr;
    data_ = nullptr;
    size_ = 0;
  }

 private:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
  int device_ = 0;
  void* entry_ = nullptr;
  UnpinFn unpin_ = nullptr;
  PinAbort* abort_ = nullptr;
};

class BufferResolver {
 public:
  virtual ~BufferResolver() = default;
  // Pins the whole registered buffer `id` for an access by a peer.
  // kNotFound when unknown or released (or being released);
  // kPermissionDenied when `token` does not match. Bounds are the caller's
  // to check against PinnedRegion::size() (see range_fits in common/wire.h).
  // `abort` (may be null) is called if release() stops waiting for this pin.
  virtual Result<PinnedRegion> pin(uint64_t id, const Token& token, PinAbort* abort) = 0;
};

// What every backend is given when it is created.
// Takes back ops that a backend accepted and then found it cannot carry
// after all (its connection to the owner could not be set up). Each op goes
// to the next backend, in priority order, that the owner offers and that can
// reach it, with `why` in the op's note; when there is none, the op fails
// (with `why`'s code when that says something about the owner, see
// Backend::can_reach). Only for ops of which no part has been reported
// (TransferState::no_part_reported); the backend gives up every part it
// holds of them and completes none.
class OpRouter {
 public:
  virtual void reroute(const std::shared_ptr<TransferState>& transfer,
                       std::span<const uint32_t> ops, std::string_view from, const Status& why) = 0;

 protected:
  ~OpRouter() = default;
};

// The owner side of notices (WriteNotice): what a backend read from a
// writer, after the bytes it names landed. Every field is the writer's
// claim; the sink checks them.
struct NoticeRecord {
  uint32_t tag = 0;
  uint64_t endpoint_key = 0;
  uint64_t buffer_id = 0;
  uint64_t offset = 0;  // within the registered buffer
  uint64_t length = 0;
  Token token{};  // the handle's: the writer proves it holds one
};

// Takes notices from the backends that carry them, for the endpoints.
class NoticeSink {
 public:
  // Delivers `notice`, read from the manager `writer` (the id its hello
  // claimed), as the notification of the endpoint it names: into the
  // manager's queue, or to its handler, which runs on this thread. OK:
  // delivered. kResourceExhausted: the queue has no room now; the backend
  // keeps it, and the ones after it, in order, holds back the writer
  // meanwhile (ibverbs: posts no receive for more), and offers it again
  // later. Any other code: refused (no such endpoint, not that peer's, a
  // token or range that does not match the buffer); the backend drops it,
  // and the status says why. Thread-safe; blocks only while the handler
  // runs.
  virtual Status deliver(uint64_t writer, const NoticeRecord& notice) = 0;

 protected:
  ~NoticeSink() = default;
};

struct BackendEnv {
  Config config;
  PeerIdentity self;
  // Resolves buffers for accesses this backend serves; outlives the backend.
  BufferResolver* resolver = nullptr;
  // Hands ops on to another backend; outlives the backend.
  OpRouter* router = nullptr;
  // Takes the notices this backend reads (may be null: none are taken);
  // outlives the backend.
  NoticeSink* notices = nullptr;
  // The event loops of the manager's outbound connections, shared by its
  // backends; never null, and outlives the backend.
  SharedLoops* loops = nullptr;
};

// ---------------------------------------------------------------------------

// A two-sided channel between this process and one peer, carried by a
// transport's own message primitive (ibverbs: SEND into posted receives):
// an ordered, reliable byte stream each way, with flow control, so that a
// writer never overruns the reader's posted room. Endpoints move their
// frames through it (core/endpoint/frame_channel.h); the bytes are the endpoint's, the
// channel keeps no boundaries between writes.
//
// Made by Backend::open_message_channel, then connected: each side sends
// the other its address() (over the endpoint's own handshake) and calls
// connect() with the peer's. No byte may be written before both sides have
// connected.
//
// Contract: one thread at a time writes, one at a time reads (the endpoint
// holds its frames lock, or its reader role); reading and writing may run
// at once. The peer can send any bytes; the channel only moves them.
class MessageChannel {
 public:
  virtual ~MessageChannel() = default;

  // What the peer's connect() needs, as bytes.
  virtual std::vector<uint8_t> address() const = 0;
  // Connects to the peer whose address() is `peer`. kProtocolError when the
  // bytes are malformed, kUnavailable when the transport cannot reach it.
  virtual Status connect(std::span<const uint8_t> peer) = 0;
  // For Endpoint::channel(): "ibverbs (rxe0, ...)".
  virtual std::string describe() const = 0;
  // Once connected: starts one one-sided read of the peer (its code takes
  // no part). probe_answered() then says, without waiting, whether the
  // peer's NIC answered it (true) or not yet (false); kUnavailable, saying
  // why, when the read failed. connect() succeeds on addresses alone, so
  // two hosts whose NICs cannot reach each other learn it here (and an
  // endpoint's frames then take TCP) rather than at the first frame.
  virtual Status start_probe() = 0;
  virtual Result<bool> probe_answered() = 0;

  // --- the writer ---------------------------------------------------------
  // Moves all the bytes of `first`, then of `pieces`, towards the peer, or
  // none when the room the peer posted (or the channel's own send room) is
  // short now: whether it did. A writer that got false tries again (the
  // room comes back as the peer reads, without a call on this side).
  // kInvalidArgument for more than capacity() bytes; kUnavailable when the
  // transport failed (the peer is gone).
  virtual Result<bool> write_whole(std::span<const uint8_t> first,
                                   std::span<const std::span<const uint8_t>> pieces) = 0;
  // The most bytes one write_whole may take.
  virtual size_t capacity() const = 0;
  // The bytes a write_whole should carry to fill one of the transport's own
  // messages (the ibverbs channel: one SEND into one posted receive); 0 when
  // it has no such unit. A channel with a unit carries a write of up to
  // write_unit() + kWriteUnitSlack bytes (at most capacity()) as one message,
  // and a larger one as several, the first of them full; each write begins a
  // message of its own. Writers with much to move write it a unit at a time,
  // with up to kWriteUnitSlack bytes of small frames in front.
  virtual size_t write_unit() const { return 0; }
  static constexpr size_t kWriteUnitSlack = 512;
  // Waits up to `limit` for the bytes written to reach the peer: called
  // before the endpoint's connection is closed, so that the peer reads
  // every frame written before the end.
  virtual void drain(std::chrono::milliseconds limit) = 0;

  // --- the reader ---------------------------------------------------------
  // Whether bytes are waiting. Cheap: a reader spins on it.
  virtual bool has_incoming() = 0;
  // The waiting bytes from the read position on, as far as they lie in one
  // piece; empty when none. Valid until read_some(), and through consume()
  // for the bytes it did not give back (a reader takes several frames from
  // one view). kUnavailable when the transport failed.
  virtual Result<std::span<const uint8_t>> peek() = 0;
  // Gives `size` bytes of the last peek() back (at most those).
  virtual void consume(size_t size) = 0;
  // Copies up to `size` waiting bytes out: how many, 0 when none.
  virtual Result<size_t> read_some(uint8_t* out, size_t size) = 0;

  // Sleeping. A reader that found nothing and is about to sleep calls
  // arm_wakeup() first: false when bytes came meanwhile (read them; do not
  // sleep). Armed, wakeup_fd() becomes readable once bytes come; the
  // reader then calls take_wakeups() (true when it took one), which makes
  // it unreadable again until the next arm_wakeup().
  virtual bool arm_wakeup() = 0;
  virtual int wakeup_fd() const = 0;
  virtual bool take_wakeups() = 0;
};

// ---------------------------------------------------------------------------

// A transport. Created by a factory that returns the backend, or a non-OK
// status whose message says why it is not viable here. All methods are
// thread-safe.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual TransportLevel level() const = 0;
  // Facts for display (devices, limits).
  virtual BackendInfo info() const = 0;

  // Owner side. Prepares `memory`, registered as buffer `id` with capability
  // `token`, for access by peers through this backend (pins it, registers it
  // with a NIC, publishes it to same-host readers, ...), and returns what
  // goes into handles for readers to use. On failure the buffer is simply
  // not offered through this backend.
  virtual Result<BackendContext> register_memory(uint64_t id, const LocalMemory& memory,
                                                 const Token& token) = 0;
  // Owner side. Undoes register_memory; called by release() after the
  // registry has no pins left. Returns only when no access through this
  // backend is in flight (the memory may be freed right after).
  virtual void unregister_memory(uint64_t id) = 0;

  // Reader side. OK when this backend can carry ops on `remote` from here;
  // otherwise a status whose message says why not (e.g. "peer is on another
  // host"). Must be cheap: it is asked for every op. The code matters when
  // no backend can carry the op: kUnavailable, kNotFound or
  // kDeadlineExceeded say something about the owner (gone, restarted,
  // unreachable) and become the op's status; any other code is a property
  // of this pairing of backends, and the op fails with kFailedPrecondition.
  virtual Status can_reach(const RemoteBuffer& remote) const = 0;

  // Reader side, asked for ops whose local memory is on a GPU: OK when this
  // backend moves the bytes straight to and from `local` for ops on
  // `remote`; otherwise why not (kFailedPrecondition), and the manager runs
  // the op through pinned host memory instead (core/staging.h), with the
  // reason in its note. The default: host memory only.
  virtual Status takes_local_memory(const LocalMemory& local, const RemoteBuffer& remote) const;

  // Reader side: OK when this backend carries atomics (Op::is_atomic) on
  // `remote`; otherwise why not. A backend that does applies each with a
  // CPU atomic instruction on the owner's memory, by its own CPU (same
  // host, memory both map) or by asking the owner's manager to: so that
  // atomics on one word are atomic with each other, whichever peer and
  // transport each came by (never with a NIC's atomics, which are not
  // coherent with the CPU's on most devices). Cheap, as can_reach. The
  // default: not carried; the manager then routes atomics to the next
  // backend the owner offers.
  virtual Status can_apply_atomics(const RemoteBuffer& remote) const;

  // Reader side. Starts ops `indices` of `transfer` (already validated:
  // ranges fit, sizes follow the read/write rules, length > 0; atomics
  // only where can_apply_atomics() says OK). Returns
  // without waiting for the network. Every op is completed later through
  // transfer->complete_part, exactly once per declared part, whatever
  // happens (success, error, cancellation, shutdown).
  virtual void submit(const std::shared_ptr<TransferState>& transfer,
                      std::span<const uint32_t> indices) = 0;

  // Inbound connections. The manager's listener accepts a connection whose
  // hello asks for channel `channel` (see common/hello.h) and, when this
  // backend claims it, asks open_session for a session that serves it on
  // the manager's shared I/O threads (common/io_pool.h); when that gives
  // none, the connection is closed. A session owns `fd` and closes it when
  // it is destroyed.
  virtual bool claims_channel(uint8_t channel) const {
    (void)channel;
    return false;
  }
  // The default gives none (and leaves `fd` alone).
  virtual std::unique_ptr<IoSession> open_session(int fd, uint64_t peer_manager_id);

  // A message channel to a peer that has this backend too (see
  // MessageChannel), for endpoints. The default offers none: the status
  // (kFailedPrecondition) says so.
  virtual Result<std::unique_ptr<MessageChannel>> open_message_channel();

  // Stops everything: fails ops in flight with kCancelled, closes
  // connections (sessions end when the listener stops). When it
  // returns, no thread of this backend touches any op's local memory.
  virtual void shutdown() = 0;
};

}  // namespace rdmabuf
