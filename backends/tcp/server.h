// The owner side of the tcp backend: serves one peer's data stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/tcp/protocol.h"
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

// Serves requests from one connection, in order, until the peer closes it,
// breaks the protocol, stalls mid-frame for stall_timeout, or the backend
// shuts down. Every request is checked (token, buffer id, bounds) against
// the registry; a refused request gets an error reply and the connection
// goes on. Replies are gathered and sent together (up to kMaxIov pieces per
// sendmsg): headers and small payloads copied into one buffer, large read
// payloads straight from the registered memory (sent before any later
// write changes those bytes); large write payloads are received straight
// into it. A buffer in GPU memory is reached through a StagingRing of
// pinned memory instead: read payloads are copied out of the GPU
// asynchronously as the requests are taken, and each is sent once its copy
// is done, while the next ones copy; write payloads are received into the
// ring and copied to the GPU while the next is received, and their replies
// go out once the copies are done.
class ServerConnection final : public PinAbort {
 public:
  ServerConnection(Fd fd, const ServerSettings& settings);
  void run();
  // Called by release() when it stops waiting for this connection's pin.
  void abort_pinned_io() override;

 private:
  // A piece of the gathered output: the next `size` bytes of tx_, or
  // `size` bytes of pinned memory at `external` (in staging_, once its
  // copy from the GPU is done, when `staged`).
  struct OutSegment {
    const std::byte* external;
    size_t size;
    bool staged = false;
  };

  bool process();
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
  // Sends everything gathered; external pieces are sent before the pin that
  // covers them may change.
  bool flush();
  // Send or receive all of it, waiting for the socket up to the stall
  // timeout at a time without progress; false when the connection is gone,
  // stalled or stopping.
  bool send_blocking(iovec* iov, int count);
  // A write's payload: between two segments the receive spins for
  // busy_poll before it sleeps, since the next one is microseconds away.
  // Asleep, every segment cost the writer a wakeup of this thread (a
  // cross-core interrupt, dear in a VM): one stream's 1 MiB messages moved
  // 6.1-7.0 GB/s, spinning 7.8-8.9. Sends still
  // sleep at once: spinning there gained nothing.
  bool recv_blocking(void* dst, size_t size);
  bool discard_blocking(size_t size);
  bool wait(short events);
  // Whether the reader has closed or reset its end of the connection: it
  // gave up on it (a deadline passed), so the writes still buffered here are
  // writes it abandoned. Applying them late could overwrite what it has
  // written since over another connection; they are dropped instead.
  bool abandoned() const;
  void drop_pin() { pin_.reset(); }

  Fd fd_;
  ServerSettings settings_;
  std::unique_ptr<uint8_t[]> rx_;
  size_t rx_end_ = 0;
  std::vector<uint8_t> tx_;
  std::vector<OutSegment> out_;
  size_t out_bytes_ = 0;
  size_t externals_ = 0;
  // The buffer pinned for the requests being processed, with the id and the
  // token it was checked against.
  PinnedRegion pin_;
  uint64_t pin_id_ = 0;
  Token pin_token_{};
  std::unique_ptr<uint8_t[]> scratch_;
  // For buffers in GPU memory; its pinned memory is allocated on first use.
  StagingRing staging_;
  bool staged_writes_ = false;  // copies to the GPU whose replies wait in out_
};

}  // namespace rdmabuf::tcp
