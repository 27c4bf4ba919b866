// The reader side of the tcp backend: per peer, a few persistent connections
// ("streams"), each driven by one I/O thread that pipelines many requests.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backends/tcp/protocol.h"
#include "common/inbox.h"
#include "common/socket.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::tcp {

// What every stream to one peer shares. Outlives the streams.
struct PeerContext {
  HostPort address;
  uint64_t owner_id = 0;
  uint64_t self_id = 0;
  std::chrono::microseconds busy_poll{0};
  std::chrono::milliseconds stall_timeout{0};
  // Backend-wide shutdown signal: the flag for loops, the eventfd for polls.
  const std::atomic<bool>* stopping = nullptr;
  int stop_fd = -1;
};

// One request's worth of an op: a whole small op, or one chunk of a large one.
struct Chunk {
  std::shared_ptr<TransferState> transfer;
  uint32_t op = 0;
  RequestKind kind = RequestKind::kRead;
  uint64_t op_offset = 0;  // where its bytes begin in the op's (common/op_extents.h)
  uint64_t length = 0;
  uint64_t cost = 0;  // counted in the stream's load until finished
  // Set by the stream's thread:
  uint64_t request_id = 0;
  uint64_t moved = 0;           // read: payload bytes received
  bool payload_unsent = false;  // write: payload not yet fully sent from `local`
};

// One TCP connection to a peer and the thread that drives it. The thread
// starts on the first enqueue, connects, and exits when the connection is
// gone and no work is left; the next enqueue starts it again. So a peer that
// restarts costs only the ops in flight when it went away.
class Stream {
 public:
  Stream(const PeerContext* peer, int index);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Takes the chunks (moves them out of `chunks`). Never blocks on the network.
  void enqueue(std::vector<Chunk>& chunks, uint64_t cost);
  // Bytes (plus a per-request cost) queued or in flight: where new work goes.
  uint64_t load() const { return load_.load(std::memory_order_relaxed); }
  // Joins the thread; every chunk not finished is completed with kCancelled.
  // Call after the backend's stopping flag is set.
  void stop();
  // True when no thread runs and no work waits (the connection is closed).
  bool idle();

 private:
  struct TxSegment {
    const std::byte* external;  // null: the next `size` bytes of the tx arena
    Chunk* chunk;               // owner of an external segment
    size_t size;
    size_t done;
    bool last = true;  // the chunk's last segment: its payload is sent with it
  };

  void run();
  void connect();
  void encode();
  bool pump_send();
  bool pump_recv();
  bool fill_rx(size_t limit);
  void advance_tx(size_t sent);
  void on_response(const ResponseHeader& h);
  bool read_payload();
  void sleep_until_ready();
  void finish(Chunk& chunk, const Status& status);
  // Closes the connection and forgets what was sent or received on it.
  void close_connection();
  // Fails every chunk the thread holds with `why` and closes the connection.
  void fail_all(StatusCode code, const std::string& why);
  void broken(const std::string& why) { fail_all(StatusCode::kUnavailable, why); }
  // The owner said goodbye (it closes idle connections to make room): the
  // chunks it has not answered go back to pending_, for a new connection.
  void start_over();
  void protocol_error(const std::string& why) { fail_all(StatusCode::kProtocolError, why); }

  const PeerContext* peer_;
  const int index_;
  std::atomic<uint64_t> load_{0};

  Inbox<Chunk> inbox_;  // shared with submitters; starts and stops the thread

  // The thread's own state.
  Fd sock_;
  std::deque<Chunk> pending_;   // not yet encoded
  std::deque<Chunk> inflight_;  // encoded, in request order, awaiting replies
  std::vector<uint8_t> tx_;     // encoded headers and small payloads
  size_t tx_head_ = 0;          // first unsent byte of tx_
  std::deque<TxSegment> segs_;  // what to send, in order
  std::unique_ptr<uint8_t[]> rx_;
  size_t rx_begin_ = 0, rx_end_ = 0;
  bool in_payload_ = false;  // inflight_.front() is a read whose payload is arriving
  uint64_t next_request_id_ = 1;
  Clock::time_point last_io_;
  std::unique_ptr<uint8_t[]> scratch_;  // where payloads of cancelled reads go
};

// All streams to one peer manager.
class Peer {
 public:
  Peer(PeerContext context, int streams);
  // Cuts the ops into chunks of at most `chunk_size` (and kMaxRequestRanges
  // ranges) and spreads them over the streams by load. Declares the part
  // counts on `transfer`.
  void submit(const std::shared_ptr<TransferState>& transfer, std::span<const uint32_t> ops,
              uint64_t chunk_size);
  void stop();
  // True when every stream is idle: the peer can be forgotten.
  bool idle();

 private:
  PeerContext context_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

}  // namespace rdmabuf::tcp
