// The owner side of the tcp backend: serves one peer's data stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/tcp/protocol.h"
#include "common/io_pool.h"
#include "common/socket.h"
#include "common/staging_ring.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::tcp {

struct ServerSettings {
  BufferResolver* resolver = nullptr;
  std::chrono::microseconds busy_poll{0};
  std::chrono::milliseconds stall_timeout{0};
  const std::atomic<bool>* stopping = nullptr;
  int stop_fd = -1;
};

// Serves requests from one connection, in order, as an IoSession: it runs
// when its socket is ready and does what it can without waiting, so that a
// few threads serve any number of connections. It ends when the peer closes
// the connection, breaks the protocol, stalls mid-frame for stall_timeout
// (or leaves replies unread that long), or the backend shuts down. Every
// request is checked (token, buffer id, bounds) against the registry; a
// refused request gets an error reply and the connection goes on. Replies
// are gathered and sent together (up to kMaxSendIov pieces per sendmsg):
// headers and small payloads copied into one buffer, large read payloads
// straight from the registered memory (sent before any later write changes
// those bytes); large write payloads are received straight into it.
// Atomics are applied here, on the CPU, so that they are atomic with every
// other peer's.
// Between requests it holds no pin, no receive buffer and no reply arena
// (they go back to shared spare lists): an idle connection costs its socket
// and under a kilobyte (plus its staging ring, once it has served GPU
// memory), and may be evicted (it says goodbye first; see protocol.h).
//
// A buffer in GPU memory is reached through a StagingRing of pinned memory
// instead: read payloads are copied out of the GPU asynchronously as the
// requests are taken, and each is sent once its copy is done, while the
// next ones copy; write payloads are received into the ring and copied to
// the GPU while the next is received, and their replies go out once the
// copies are done. Those paths wait on the socket on the thread that runs
// them (up to stall_timeout without progress), where host memory never does.
class ServerConnection final : public IoSession, public PinAbort {
 public:
  ServerConnection(Fd fd, const ServerSettings& settings);
  ~ServerConnection() override;

  int fd() const override { return fd_.get(); }
  Wait on_ready() override;
  Deadline deadline() const override { return deadline_; }
  Wait on_timeout() override;
  bool idle() const override;
  bool on_evict() override;

  // Called by release() when it stops waiting for this connection's pin.
  void abort_pinned_io() override;

 private:
  // What one step of the work did.
  enum class Step { kProgress, kBlockedRead, kBlockedWrite, kClosed };

  // A piece of the gathered output: the next `size` bytes of tx_, or
  // `size` bytes of pinned memory at `external` (in staging_, once its
  // copy from the GPU is done, when `staged`).
  struct OutSegment {
    const std::byte* external;
    size_t size;
    bool staged = false;
  };
  // A write's payload still to come from the socket, after its header: it
  // lands in extents_ in order, or is discarded (refused).
  struct PendingPayload {
    RequestHeader header{};
    StatusCode code = StatusCode::kOk;
    bool keep = false;             // false: discarded
    size_t left = 0;               // bytes still to come
    std::byte* at = nullptr;       // where the next of them land
    size_t at_left = 0;            // how many of them land from `at` on
    size_t next_extent = 0;        // the extent after the one `at` is in
    bool check_abandoned = false;  // before its first byte is received
  };

  // One step: sends gathered output, receives a payload, takes one
  // request, or receives more requests, in that order of priority.
  Step advance();
  Step take_request();
  // An atomic (fetch-add, compare-and-swap): applied to the word on this
  // CPU once its operands are whole; its reply carries the previous value.
  Step take_atomic(const RequestHeader& h);
  // A scattered read or write: taken once its list of ranges is whole;
  // every range is checked before a byte moves.
  Step take_scattered(const RequestHeader& h);
  // A read's reply: the bytes of extents_, refused with `st`'s code
  // unless it is OK.
  Step reply_to_read(const RequestHeader& h, const Status& st);
  // A write's payload, which follows its header (and list) on the socket:
  // into extents_ when `st` is OK, discarded otherwise.
  Step take_payload(const RequestHeader& h, const Status& st);
  // Copies `n` payload bytes at `from` to where they land (payload_.keep).
  void land(const uint8_t* from, size_t n);
  // Moves payload_.at to the next extent once the current one is full.
  void next_extent();
  Step receive_payload();
  Step receive_requests();
  // After a request's reply is gathered: sends once enough is waiting.
  Step after_request();
  // Every later step waits until the gathered output is sent.
  Step start_flush() {
    flushing_ = true;
    return Step::kProgress;
  }
  // Sends gathered output until it is all sent or the socket is full.
  Step send_some();
  void finish_flush();
  bool between_requests() const { return rx_end_ == 0 && payload_.left == 0; }

  bool pin_matches(const RequestHeader& h) const;
  Status resolve(const RequestHeader& h, std::byte** at);
  void append_reply(const RequestHeader& h, StatusCode code, uint64_t payload);
  void append_bytes(const void* data, size_t size);
  void append_external(const std::byte* data, size_t size, bool staged = false);
  // A read's payload from a buffer in GPU memory: copied into staging_ and
  // gathered. False when the connection must end (a CUDA error, or a flush
  // that failed).
  bool append_from_gpu(const std::byte* at, uint64_t length);
  // A write's payload into a buffer in GPU memory: the `buffered` bytes at
  // `have`, then the rest from the socket, through staging_.
  bool receive_into_gpu(std::byte* at, uint64_t length, const uint8_t* have, size_t buffered);
  bool has_external() const { return externals_ > 0; }
  // The GPU paths' waits on the socket, on the calling thread: send all
  // that is gathered; receive exactly `size` bytes.
  bool flush_blocking();
  bool recv_blocking(void* dst, size_t size);
  bool wait(short events);
  // Whether the reader has closed or reset its end of the connection: it
  // gave up on it (a deadline passed), so the writes still buffered here are
  // writes it abandoned. Applying them late could overwrite what it has
  // written since over another connection; they are dropped instead.
  bool abandoned() const;
  // abandoned(), asked once per batch of bytes received (a poll each time
  // would cost a system call per request); false when already asked.
  bool abandoned_since_receive();
  void drop_pin() { pin_.reset(); }
  // While the connection waits: gives its receive buffer back to the
  // spare list unless part of a request is in it.
  void release_receive_buffer();
  // While it waits between requests: trims the reply arena too.
  void release_idle_memory();

  Fd fd_;
  ServerSettings settings_;
  Deadline deadline_ = Deadline::max();

  // Received requests: the next one starts at rx_pos_; rx_ is taken from a
  // shared spare list when bytes are to be received, and given back when
  // the connection waits with none of them left unread.
  std::unique_ptr<uint8_t[]> rx_;
  size_t rx_pos_ = 0;
  size_t rx_end_ = 0;
  bool checked_abandoned_ = false;  // since the last bytes received
  bool served_any_ = false;         // a reply has been gathered
  PendingPayload payload_;
  // Where the request being taken reads from or writes to in the pinned
  // buffer: one extent, or a scattered request's ranges, in order.
  std::vector<std::pair<std::byte*, uint64_t>> extents_;

  std::vector<uint8_t> tx_;
  std::vector<OutSegment> out_;
  size_t out_bytes_ = 0;
  size_t externals_ = 0;
  bool flushing_ = false;
  // The send's place in out_: the segment, the bytes of it sent, and where
  // that segment starts in tx_ (when it is not external).
  size_t send_segment_ = 0;
  size_t send_offset_ = 0;
  size_t send_arena_at_ = 0;

  // The buffer pinned for the requests being processed, with the id and the
  // token it was checked against.
  PinnedRegion pin_;
  uint64_t pin_id_ = 0;
  Token pin_token_{};
  // For buffers in GPU memory; its pinned memory is allocated on first use.
  StagingRing staging_;
  bool staged_writes_ = false;  // copies to the GPU whose replies wait in out_
};

}  // namespace rdmabuf::tcp
