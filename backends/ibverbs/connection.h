// The reader side of the ibverbs backend: one RC queue pair to one device of
// one owner, driven on an event loop that it shares with other pairs (and
// their completion queue: completion_queue.h).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/ibverbs/completion_queue.h"
#include "backends/ibverbs/device.h"
#include "backends/ibverbs/handshake.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/event_loop.h"
#include "common/loop_inbox.h"
#include "common/socket.h"
#include "common/worker_pool.h"
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
  // Backend-wide shutdown: the flag for loops, the eventfd for polls.
  const std::atomic<bool>* stopping = nullptr;
  int stop_fd = -1;
  // Takes ops this connection cannot carry (no queue pair) to another backend.
  OpRouter* router = nullptr;
  // Runs the handshakes (they block on the owner), the backend's for all
  // its connections: the threads follow the handshakes under way, up to
  // kMostHandshakes, not the owners.
  WorkerPool* handshakers = nullptr;
};

// Handshakes under way at once, per backend; more wait their turn. Each
// takes at most its budget (10 s) even with an owner that never answers.
constexpr int kMostHandshakes = 64;

// Work requests a reader's queue pair holds at once.
constexpr uint32_t kPairDepth = 512;

// The most local pieces one work request of a connection gathers or
// scatters into, whatever the device allows beyond.
constexpr uint32_t kMaxGather = 16;

// The local pieces a connection's work requests may take on `device`.
inline uint32_t gather_limit(const Device& device) {
  return static_cast<uint32_t>(std::clamp(device.attr().max_sge, 1, static_cast<int>(kMaxGather)));
}

// Local memory of a chunk whose bytes lie in more than one place.
struct LocalPiece {
  std::byte* at = nullptr;
  uint32_t length = 0;
};

// One work request's worth of an op: at most the maximum message size, of
// one contiguous remote range.
struct Chunk {
  std::shared_ptr<TransferState> transfer;
  uint32_t op = 0;
  OpKind kind = OpKind::kReadIntoLocal;
  std::byte* local = nullptr;
  uint64_t remote_addr = 0;  // the key comes from the owner's grant, at post time
  uint32_t length = 0;
  // Empty: the local bytes are [local, local + length). Else the remote
  // range's bytes lie in these local pieces, in order (at most
  // gather_limit(), adding up to `length`; `local` is the first): a
  // scattered op's ranges that are adjacent in remote memory, one work
  // request with a gather entry each.
  std::vector<LocalPiece> pieces;
  // Times it was flushed by a queue pair failure it did not cause; such a
  // chunk is posted again on the next queue pair, once.
  int retries = 0;
  // The op's notice (TransferState::notice), not its bytes: a SEND of
  // kNoticeBytes, enqueued right after the op's last chunk of bytes, so
  // that it reaches the owner only after they have landed.
  bool notice = false;
};

// The queue pair is created lazily: the first chunk starts the handshake
// with the owner over its listener, on a thread of its own that ends with
// it (the owner creates its side and keeps it while the handshake's
// connection stays open), while the loop goes on serving other pairs. Then
// the loop posts work requests (many in flight, signalled selectively),
// and takes their completions from the loop's shared queue.
//
// When a work request fails, or a transfer with work requests in flight is
// cancelled (its deadline passed), the loop moves the queue pair to error
// and drains it, so that no DMA can touch local memory any more, and only
// then completes the chunks: the failed one with the root cause (never the
// flush errors that follow it), cancelled ones as cancelled, and the others
// are posted again on a fresh queue pair. When one work request fails, its
// whole op fails with it (its other chunks are not posted again). So does an
// op whose notice was posted and had not completed: it may have reached the
// owner, and bytes posted again after it would land after the owner was
// told they had (Unavailable: the write and its notice may have landed).
// A drain holds the loop (a NIC flushes in microseconds; at most
// kDrainLimit), and so does asking the owner why a request was refused
// (explain(): at most kExplainLimit).
//
// Before a handle's first use on a queue pair the owner confirms it (see
// ask()): the handle's chunks wait aside, never posted, while the question
// is out, and the loop goes on posting and polling for everyone else. An
// owner that does not answer within 10 s has its queue pair reset. While
// requests are in flight and none completes for a second, the owner is
// asked again about their buffers (see check_stalled()).
//
// A failed handshake hands the waiting ops on to the next backend the owner
// offers (tcp, say), with the failure as the reason; ops with a part done
// already fail. It is remembered for a backoff (100 ms, doubling to 5 s):
// meanwhile health() reports it, so new ops go elsewhere at once; afterwards
// the next chunk tries again.
class Connection final : public LoopTask,
                         public CompletionSink,
                         public std::enable_shared_from_this<Connection> {
 public:
  // Driven on `loop`, whose completion queues `completions` are.
  Connection(ConnectionContext context, EventLoop& loop,
             std::shared_ptr<LoopCompletions> completions);
  ~Connection() override;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Takes the chunks (moves them out). Never blocks on the network.
  void enqueue(std::vector<Chunk>& chunks);
  // OK, or the last handshake failure while its backoff lasts.
  Status health() const;
  // Every chunk not finished completes with kCancelled: those not yet on
  // the loop here, the others on the loop's next run of the connection (at
  // the latest as the loop stops), which also destroys the queue pair.
  // Waits for a handshake under way, which the backend's stop signal
  // ends. Later enqueues fail at once.
  void stop();
  // True when no work waits and the connection holds no queue pair and no
  // handshake: it can be forgotten.
  bool idle();

  void on_run(EventLoop& loop) override;
  void take_completion(const ibv_wc& wc) override;
  std::shared_ptr<LoopTask> sink_task() override { return shared_from_this(); }
  void queue_failed(ibv_cq* cq) override;

 private:
  // A handshake under way on a handshaker (ConnectionContext::handshakers),
  // and what it came to.
  struct Handshake {
    HandleClaim claim;  // presented to the owner
    std::mutex mu;
    // Under mu: set once each, by the handshake's job.
    bool done = false;   // its outcome is below
    bool ended = false;  // the job is done with the connection and its loop
    Status status;
    bool claim_refused = false;  // the owner refused the handle presented
    std::unique_ptr<QueuePair> qp;
    Fd control;
    std::condition_variable ended_cv;  // ended became true
  };

  struct Posted {
    Chunk chunk;
    std::shared_ptr<MemoryRegion> region;  // the local registration the NIC uses
    uint64_t wr_id;
    bool signalled;  // it asked for a completion (see check_stalled())
  };

  // A request for access to a buffer, sent to the owner, not answered yet.
  struct Query {
    uint64_t seq;
    HandleClaim claim;
    Clock::time_point sent;
  };
  // What the owner said of a handle used here: the key that reaches its
  // buffer through this pair (answer OK), or why not.
  struct Validated {
    HandleClaim claim;
    Status answer;
    uint32_t rkey = 0;
  };

  // Moves what was enqueued to pending_; true once stop() was called.
  bool take_incoming();
  // Completes every chunk held as cancelled and destroys the queue pair.
  void shut_down();
  // One pass at posting, completions, answers and cancellations; false
  // when nothing moved.
  bool step();
  // Watches the control connection, asks for polling while requests are
  // in flight, and sets the timer that notices cancellations and stalls.
  void settle();
  // Starts a handshake for the chunks waiting, unless a failure's backoff
  // lasts (then they go on to another backend).
  void begin_handshake();
  // The handshake's job: a pair on `room`, set up with the owner.
  static void shake_hands(ConnectionContext context, HandleClaim claim, CqRoom room,
                          std::shared_ptr<Handshake> into, std::weak_ptr<Connection> self,
                          EventLoop* loop);
  // Takes the handshake's outcome once it is done; false while under way.
  bool finish_handshake();
  // Waits for the handshake's job to end, if one was started (not on its
  // own thread: it ends before it lets go of the connection).
  void wait_for_handshaker();
  bool post();
  bool poll();
  bool cancel_if_needed();
  // Looks at the requests in flight (step(), while there are some). A NIC refuses an access
  // to a buffer its owner deregistered mid-op at once (poll(), explain(): NotFound), but
  // Soft-RoCE's responder (Linux 6.1) may leave an RDMA READ of one neither
  // answered nor refused, and its requester waits for the rest of the
  // response for ever: the op would run to its deadline. So when no
  // completion has moved the oldest posted request on for kStallLimit, the
  // owner is asked again about the buffers of the requests that may hold
  // the queue up (up to the first signalled one), and new chunks for those
  // buffers wait for the answers. One released (or refused): the first of
  // its requests fails, with its op, and the queue pair is reset (drained
  // first, so no DMA touches local memory after); the other ops' requests
  // go again on a new pair. All still there: the requests are slow, not
  // stuck, and are watched afresh, so at most one round of questions goes
  // out each kStallLimit.
  void check_stalled();
  // Error, drain, destroy; completes or requeues every posted chunk. The
  // work request `failed` (or 0 for none), whose completion said
  // `failed_wc`, failed with `cause`, and so does the rest of its op; the
  // others are posted again on a fresh queue pair.
  void reset(uint64_t failed, Status cause, ibv_wc_status failed_wc = IBV_WC_SUCCESS);
  // The root cause of a failed work request, in the library's terms; may
  // ask the owner (a refused key: was the buffer released?).
  Status explain(ibv_wc_status status, const Chunk& chunk);
  // What the owner said of `remote` (id, token, size) on this pair, or null
  // when it has not been asked. Asked once per handle and pair before its
  // first work request, since only the owner's answer gives the key that
  // reaches the buffer through this pair (handshake.h); and again only when
  // an access was refused (explain()) or requests stalled
  // (check_stalled()), either of which may mean that the owner released
  // the buffer.
  const Validated* validated(const RemoteBuffer& remote) const;
  const Status* answer_about(const RemoteBuffer& remote) const;
  // Sends the question about `remote` unless it is already out.
  Status ask(const RemoteBuffer& remote);
  // Takes the answers that have arrived, without blocking; an error when the
  // control connection failed or the owner answered out of turn.
  Status take_answers();
  // take_answers() for the loop: resets the queue pair on an error
  // or an owner that leaves a question unanswered too long.
  bool read_answers();
  // Chunks of cancelled transfers that wait for an answer complete now.
  bool drop_cancelled_parked();
  void complete(Chunk& chunk, const Status& status);
  // The registration of the chunk's local memory (every piece of it).
  Result<std::shared_ptr<MemoryRegion>> acquire_region(const Chunk& chunk);
  // Fills in the work request `wr` (its wr_id set) and `sge` that send
  // `chunk`'s notice; the slot of wr_id holds the bytes until it completes.
  // The registration the bytes lie in.
  Result<std::shared_ptr<MemoryRegion>> build_notice(const Chunk& chunk, ibv_send_wr& wr,
                                                     ibv_sge& sge);
  void finish_posted(Posted& p, const Status& status);
  bool touch(TransferState* t);
  void untouch(TransferState* t);
  void fail_pending(const Status& status);
  // The queue pair cannot be set up: see the class comment.
  void hand_on_pending(const Status& failure);

  // Closes the control connection (and stops watching it).
  void close_control();

  const ConnectionContext context_;
  EventLoop& loop_;
  const std::shared_ptr<LoopCompletions> completions_;
  mutable std::mutex health_mu_;
  Status failure_;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{100};

  // What submitters hand the connection.
  LoopInbox<Chunk> inbox_;

  // The handshake whose job may still run, waited for by the loop once it
  // is done, or by stop(). Taken before inbox_'s lock where both are held.
  std::mutex handshaker_mu_;
  std::shared_ptr<Handshake> shaking_;  // guarded by handshaker_mu_

  // The loop's own state.
  std::shared_ptr<Handshake> handshake_;  // while one is under way
  std::unique_ptr<QueuePair> qp_;
  uint64_t generation_ = 0;      // qp_'s (LoopCompletions::new_generation)
  std::vector<ibv_wc> arrived_;  // qp_'s completions, taken for the next poll()
  bool queue_failed_ = false;    // qp_'s completion queue failed: no drain to wait for
  bool posted_now_ = false;      // post() posted since the last settle()
  Fd control_;                   // the handshake's connection: the owner's side lives as long
  bool control_watched_ = false;
  std::deque<Chunk> pending_;
  std::deque<Posted> posted_;  // in post order
  uint64_t next_wr_ = 1;
  // Transfers with work requests posted, and how many: each holds one
  // begin_touch bracket on its transfer while the NIC may use its memory.
  std::unordered_map<TransferState*, uint32_t> touching_;
  // The notices' bytes, a slot per work request the queue pair may hold
  // (slot wr_id % depth: posted_ never holds more), registered on first use.
  std::unique_ptr<uint8_t[]> notice_slots_;
  std::shared_ptr<MemoryRegion> notice_region_;
  // What the owner said of each handle used here (see validated()), by id.
  // Ids are never reused, so a refusal stays true; a grant holds while this
  // pair does (reset() forgets it), or until the owner releases the buffer,
  // which explain() and check_stalled() find out by forgetting it and asking
  // again. A release they learnt is recorded too.
  std::unordered_map<uint64_t, Validated> validated_;
  // Questions out, in the order sent (the owner answers in that order),
  // and the bytes of the next answer received so far.
  std::deque<Query> asked_;
  uint64_t next_query_ = 1;
  std::array<uint8_t, kAnswerBytes> answer_bytes_{};
  size_t answer_have_ = 0;
  // Chunks waiting for the owner's answer about their buffer, by buffer id.
  std::unordered_map<uint64_t, std::vector<Chunk>> parked_;
  // The highest wr_id whose completion (of any status) was polled.
  uint64_t completed_through_ = 0;
  // check_stalled(): the oldest posted request when it last looked (0:
  // none), since when it has been the oldest, and whether the owner was
  // asked about its buffer.
  uint64_t watched_wr_ = 0;
  Clock::time_point watched_since_{};
  bool stall_asked_ = false;
};

}  // namespace rdmabuf::ibverbs
