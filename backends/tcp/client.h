// The reader side of the tcp backend: per peer, a few persistent connections
// ("streams"), each driven on one of a fixed set of event loops that
// pipelines many requests on it. Threads do not grow with peers.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/tcp/protocol.h"
#include "common/event_loop.h"
#include "common/hello.h"
#include "common/loop_inbox.h"
#include "common/socket.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::tcp {

// What every stream to one peer shares.
struct PeerContext {
  HostPort address;
  uint64_t owner_id = 0;
  uint64_t self_id = 0;
  std::chrono::milliseconds stall_timeout{0};
  // Backend-wide shutdown signal.
  const std::atomic<bool>* stopping = nullptr;
};

// One request's worth of an op: a whole small op, or one chunk of a large one.
struct Chunk {
  std::shared_ptr<TransferState> transfer;
  uint32_t op = 0;
  RequestKind kind = RequestKind::kRead;
  uint64_t op_offset = 0;  // where its bytes begin in the op's (common/op_extents.h)
  uint64_t length = 0;
  uint64_t cost = 0;  // counted in the stream's load until finished
  // Set on the stream's loop:
  uint64_t request_id = 0;
  uint64_t moved = 0;           // read: payload bytes received
  bool payload_unsent = false;  // write: payload not yet fully sent from `local`
};

// One TCP connection to a peer, driven on one event loop that it shares
// with other streams. The first work connects it (without blocking the
// loop), and requests are pipelined on it; an idle stream keeps its
// connection, watched for the owner closing it, and costs no thread. A
// broken connection fails the ops it carried, and the next work connects
// again: a peer that restarts costs only the ops in flight when it went away.
class Stream final : public LoopTask, public std::enable_shared_from_this<Stream> {
 public:
  Stream(std::shared_ptr<const PeerContext> peer, int index, EventLoop& loop);
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Takes the chunks (moves them out of `chunks`). Never blocks on the network.
  void enqueue(std::vector<Chunk>& chunks, uint64_t cost);
  // Bytes (plus a per-request cost) queued or in flight: where new work goes.
  uint64_t load() const { return load_.load(std::memory_order_relaxed); }
  // Every chunk not finished completes with kCancelled: those not yet on
  // the loop here, the others on the loop's next run of the stream (at the
  // latest as the loop stops), which also closes the connection. Later
  // enqueues fail at once.
  void stop();
  // True when no work waits and no connection is open.
  bool idle();

  void on_run(EventLoop& loop) override;

 private:
  // Where the connection stands; a stream's loop moves it along.
  enum class Link : uint8_t {
    kClosed,      // no socket; work connects it
    kResolving,   // a thread of its own looks the owner's host name up
    kConnecting,  // connecting_ waits for the socket to connect
    kGreeting,    // hello sent on sock_; its reply arrives in rx_
    kOpen,        // requests flow
  };

  // Replies are read into a buffer this large in bulk, except large read
  // payloads, which are received straight into the destination.
  static constexpr size_t kRxBytes = 256 << 10;

  struct TxSegment {
    const std::byte* external;  // null: the next `size` bytes of the tx arena
    Chunk* chunk;               // owner of an external segment
    size_t size;
    size_t done;
    bool last = true;  // the chunk's last segment: its payload is sent with it
  };

  // Moves what was enqueued to pending_; true once stop() was called.
  bool take_incoming();
  // One pass at whatever the connection needs; false when nothing moved.
  bool step();
  void begin_connect();
  // Connecting from here, or the ops fail with why it cannot begin.
  void start_connecting(Result<TcpConnecting> connecting);
  // What the stream says in its hello.
  Hello hello() const;
  // Starts the lookup of a host name on a thread of its own: a resolver
  // may take seconds, and the loop serves other streams meanwhile.
  void begin_lookup();
  bool advance_lookup();
  bool advance_connect();
  bool advance_greeting();
  // Watches the socket and sets the stall or connect timer as the link
  // stands; tells inbox_ whether the stream holds anything.
  void settle();
  void encode();
  bool pump_send();
  bool pump_recv();
  bool fill_rx(size_t limit);
  void advance_tx(size_t sent);
  void on_response(const ResponseHeader& h);
  bool read_payload();
  void finish(Chunk& chunk, const Status& status);
  // Closes the connection and forgets what was sent or received on it.
  void close_connection();
  // Fails every chunk the stream holds with `why` and closes the connection.
  void fail_all(StatusCode code, const std::string& why);
  void broken(const std::string& why) { fail_all(StatusCode::kUnavailable, why); }
  // The owner said goodbye (it closes idle connections to make room): the
  // chunks it has not answered go back to pending_, for a new connection.
  void start_over();
  void protocol_error(const std::string& why) { fail_all(StatusCode::kProtocolError, why); }

  const std::shared_ptr<const PeerContext> peer_;
  const int index_;
  EventLoop& loop_;
  std::atomic<uint64_t> load_{0};

  // What submitters hand the stream.
  LoopInbox<Chunk> inbox_;
  // The name lookup's outcome, for lookup number `lookups_`; under mu_,
  // shared with the lookup's thread.
  std::mutex mu_;
  std::optional<Result<TcpConnecting>> looked_up_;
  uint64_t lookups_ = 0;

  // The loop's own state.
  Link link_ = Link::kClosed;
  std::optional<TcpConnecting> connecting_;
  Deadline connect_deadline_{};  // for connecting and greeting
  Fd sock_;
  std::deque<Chunk> pending_;      // not yet encoded
  std::deque<Chunk> inflight_;     // encoded, in request order, awaiting replies
  std::vector<uint8_t> tx_;        // encoded headers and small payloads
  size_t tx_head_ = 0;             // first unsent byte of tx_
  std::deque<TxSegment> segs_;     // what to send, in order
  std::unique_ptr<uint8_t[]> rx_;  // while a connection is open and not long idle
  size_t rx_begin_ = 0, rx_end_ = 0;
  bool in_payload_ = false;  // inflight_.front() is a read whose payload is arriving
  uint64_t next_request_id_ = 1;
  Clock::time_point last_io_;
};

// All streams to one peer manager.
class Peer {
 public:
  // The streams go to the loops in turn.
  Peer(PeerContext context, int streams, EventLoops& loops);
  ~Peer();
  // Cuts the ops into chunks of at most `chunk_size` (and kMaxRequestRanges
  // ranges) and spreads them over the streams by load. Declares the part
  // counts on `transfer`.
  void submit(const std::shared_ptr<TransferState>& transfer, std::span<const uint32_t> ops,
              uint64_t chunk_size);
  // Stream::stop on each.
  void stop();
  // True when every stream is idle: the peer can be forgotten.
  bool idle();

 private:
  std::shared_ptr<const PeerContext> context_;
  std::vector<std::shared_ptr<Stream>> streams_;
};

}  // namespace rdmabuf::tcp
