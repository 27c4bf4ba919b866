// The reader side of the ibverbs backend: one RC queue pair to one device of
// one owner, and the thread that drives it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/ibverbs/device.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/inbox.h"
#include "common/socket.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::ibverbs {

// What a connection knows of its two ends. Outlives the connection.
struct ConnectionContext {
  const Device* device = nullptr;
  LocalRegistrations* registrations = nullptr;
  HostPort owner_address;
  uint64_t owner_id = 0;
  std::string owner_device;
  uint64_t self_id = 0;
  std::chrono::microseconds busy_poll{0};
  // Backend-wide shutdown: the flag for loops, the eventfd for polls.
  const std::atomic<bool>* stopping = nullptr;
  int stop_fd = -1;
};

// One work request's worth of an op: at most the maximum message size.
struct Chunk {
  std::shared_ptr<TransferState> transfer;
  uint32_t op = 0;
  OpKind kind = OpKind::kReadIntoLocal;
  std::byte* local = nullptr;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  // Times it was flushed by a queue pair failure it did not cause; such a
  // chunk is posted again on the next queue pair, once.
  int retries = 0;
};

// The queue pair is created lazily: the first chunk starts the thread, which
// runs the handshake with the owner over its listener (the owner creates its
// side and keeps it while the handshake's connection stays open), then posts
// work requests (many in flight, signalled selectively) and polls their
// completions (spinning for the busy-poll window, then backing off).
//
// When a work request fails, or a transfer with work requests in flight is
// cancelled (its deadline passed), the thread moves the queue pair to error
// and drains it, so that no DMA can touch local memory any more, and only
// then completes the chunks: the failed one with the root cause (never the
// flush errors that follow it), cancelled ones as cancelled, and the others
// are posted again on a fresh queue pair. Before a handle's first use on a
// queue pair, the owner confirms it (see validate()). A failed handshake is remembered
// for a backoff (100 ms, doubling to 5 s); meanwhile health() reports it
// and new chunks fail at once; afterwards the next chunk tries again.
class Connection {
 public:
  explicit Connection(ConnectionContext context);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Takes the chunks (moves them out). Never blocks on the network.
  void enqueue(std::vector<Chunk>& chunks);
  // OK, or the last handshake failure while its backoff lasts.
  Status health() const;
  // Joins the thread; every chunk not finished completes with kCancelled.
  void stop();
  bool idle() { return inbox_.idle(); }

 private:
  struct Posted {
    Chunk chunk;
    std::shared_ptr<MemoryRegion> region;  // the local registration the NIC uses
    uint64_t wr_id;
  };

  void run();
  void connect();
  bool post();
  bool poll();
  bool cancel_if_needed();
  void sleep_idle();
  // Error, drain, destroy; completes or requeues every posted chunk.
  // `failed` (a wr_id, or 0) gets `cause`; the others are requeued.
  void reset(uint64_t failed, const Status& cause);
  Status explain(const ibv_wc& wc, const Chunk& chunk);
  // Whether the owner knows `remote` as its handle says (id, token, size),
  // asked once per handle per queue pair: the NIC checks only the key and
  // the registered range, so a forged token or size would go unnoticed.
  Status validate(const RemoteBuffer& remote);
  void complete(Chunk& chunk, const Status& status);
  void finish_posted(Posted& p, const Status& status);
  bool touch(TransferState* t);
  void untouch(TransferState* t);
  void fail_pending(const Status& status);

  const ConnectionContext context_;
  mutable std::mutex health_mu_;
  Status failure_;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{100};

  Inbox<Chunk> inbox_;

  // The thread's own state.
  std::unique_ptr<QueuePair> qp_;
  Fd control_;  // the handshake's connection: the owner's side lives as long
  std::deque<Chunk> pending_;
  std::deque<Posted> posted_;  // in post order
  uint64_t next_wr_ = 1;
  // Transfers with work requests posted, and how many: each holds one
  // begin_touch bracket on its transfer while the NIC may use its memory.
  std::unordered_map<TransferState*, uint32_t> touching_;
  // What the owner said of each handle used here (see validate()), by id.
  // Ids are never reused, so answers stay true; a release learnt from a
  // refused access is recorded too.
  struct Validated {
    Token token;
    uint64_t region_size;
    Status answer;
  };
  std::unordered_map<uint64_t, Validated> validated_;
};

}  // namespace rdmabuf::ibverbs
