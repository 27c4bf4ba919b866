// The endpoint itself (rdmabuf/endpoint.h): two-sided messages, handles,
// lent memory and notifications over a control connection between two
// managers; the bytes of large messages and of writes move by one-sided
// ops. Its parts, each in a file of its own:
//
//   frames.h            every frame's encoder and decoder
//   handshake.h         the hellos and the choice of a channel
//   frame_channel.h     the channel frames travel through
//   credits.h           flow control
//   send_queue.h        posted sends and their stages     (sends.cc)
//   receive_table.h     posted receives and their answers (receives.cc)
//   reader_role.h       who reads the channel now          (progress.cc, reading.cc)
//   server.h            what reads while no caller does: a loop task and
//                       its turns on the endpoint workers  (progress.cc)
//   writing.cc          frames out: the frames lock, replies held back
//   lending.cc          memory lent to the peer, and its leases
//   notification_delivery.cc  notifications to the manager's queue
//   listener.cc         EndpointListener, and the manager's listen/connect
//
// Locks. mu_, the state lock (a StateLock proves it held), guards the
// endpoint's state: receives, sends, the peer's credits, replies, loans,
// notifications, broken_. The frames lock, one writer at a time into the
// channel, also guards the credits held back: where writes never wait
// (frames_in_place channels) it is mu_ itself, so that a message's path
// takes one lock; where they may wait (TCP) it is write_mu_, so that mu_
// stays free for the reader meanwhile. Either is taken with no other lock
// held. The reader role (reader_role.h) gives its holder the reading state
// (Reading). deliver_mu_ orders notifications into the manager's queue and
// is never taken under mu_.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/futex_mutex.h"
#include "common/host.h"
#include "common/ring_queue.h"
#include "common/socket.h"
#include "core/endpoint/credits.h"
#include "core/endpoint/endpoint_host.h"
#include "core/endpoint/frame_channel.h"
#include "core/endpoint/frames.h"
#include "core/endpoint/handshake.h"
#include "core/endpoint/reader_role.h"
#include "core/endpoint/receive_table.h"
#include "core/endpoint/send_queue.h"
#include "core/endpoint/server.h"
#include "core/endpoint/spin_stretch.h"
#include "core/endpoint/state_lock.h"
#include "rdmabuf/endpoint.h"

namespace rdmabuf {
namespace endpoint {

// Notifications read but not yet delivered by the endpoint's server; at
// this many, reading stops until it catches up (backpressure on the writer).
constexpr size_t kMaxPendingNotes = 1024;
// Bytes read from a stream channel at once: many small frames.
constexpr size_t kInCapacity = 64 * 1024;
static_assert(kInCapacity >= kHeaderSize + kMaxPayload, "a whole frame fits");
// How long closing an endpoint waits for its last frames to reach the peer
// (RDMA channel).
constexpr auto kDrainLimit = std::chrono::milliseconds(500);

}  // namespace endpoint

using endpoint::Credit;
using endpoint::Frame;
using endpoint::FrameBuilder;
using endpoint::FrameChannel;
using endpoint::ReaderRole;
using endpoint::StateLock;

// When a wait on an endpoint gives up: `timeout` after the wait first found
// nothing to take, read from the clock only then. A wait whose answer is
// there already reads no clock (a read costs about 40 ns here: as much as
// the rest of taking a small message).
class WaitDeadline {
 public:
  explicit WaitDeadline(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  Deadline get() {
    if (at_ == Deadline::min()) at_ = Clock::now() + timeout_;
    return at_;
  }

 private:
  std::chrono::milliseconds timeout_;
  Deadline at_ = Deadline::min();  // not read yet
};

class EndpointImpl final : public NoticeTaker {
 public:
  // An endpoint over `fd`, its frames through the channel `choice` the
  // handshake settled; `mine` and `theirs`: the two hellos.
  static Result<std::shared_ptr<EndpointImpl>> create(endpoint::EndpointHost& host, Fd fd,
                                                      endpoint::ChannelChoice choice,
                                                      std::string peer, const endpoint::Hello& mine,
                                                      const endpoint::Hello& theirs);
  ~EndpointImpl();

  const endpoint::EndpointHost& host() const { return host_; }
  const std::string& peer() const { return peer_; }
  const std::string& channel() const { return channel_.describe(); }
  // Breaks the endpoint with `why` and ends its threads; with
  // `wait_for_server`, also waits for its server's last turn where that
  // may be waited for (endpoint.cc).
  void close(const Status& why, bool wait_for_server = true);

  // --- messages (sends.cc, receives.cc) ---
  // Posts `message` (see Endpoint::post_send). `write_timeout` bounds its
  // one-sided write. With `id` SendQueue::kAnswered, the outcome (a free
  // credit, and one frame answered it); with kRefused, why nothing was
  // posted; else OK, and `id` is the number of its record for wait_send().
  // (No Result of a variant to build, test and take apart on every
  // message's path.)
  Status post_send(const LocalMemory& message, std::chrono::milliseconds write_timeout,
                   uint64_t& id);
  // Waits for posted send `id`; at the deadline, cancels it.
  Status wait_send(uint64_t id, std::chrono::milliseconds timeout);
  // Posts `into` for the next message: the receive's sequence number.
  Result<uint64_t> post_receive(const LocalMemory& into);
  // Waits for the message of receive `seq`: its size. At the deadline the
  // receive is withdrawn (see Endpoint::receive).
  Result<uint64_t> wait_receive(uint64_t seq, std::chrono::milliseconds timeout);
  // Gives up receive `seq` without waiting: once this returns, no byte lands
  // in its memory; a message that landed already is dropped.
  void abandon_receive(uint64_t seq);

  // --- writes, handles, lending ---
  Status write(const RemoteBuffer& dst, const LocalMemory& src, uint32_t tag,
               std::chrono::milliseconds timeout);
  Status send_buffer(const RemoteBuffer& buffer);
  Result<RemoteBuffer> receive_buffer(std::chrono::milliseconds timeout);
  Result<Lease> request_remote_buffer(uint64_t size, std::chrono::milliseconds lease,
                                      std::chrono::milliseconds timeout);
  Result<std::chrono::milliseconds> renew(const RemoteBuffer& lent, std::chrono::milliseconds lease,
                                          std::chrono::milliseconds timeout);
  Result<LocalMemory> receive_local_buffer(std::chrono::milliseconds timeout);

  // --- NoticeTaker (notification_delivery.cc) ---
  Result<Notification> notification_for(uint64_t writer, const NoticeRecord& notice) override;
  void look_for_notes() override;
  void looks_ended() override;

  EndpointImpl(endpoint::EndpointHost& host, Fd fd, FrameChannel::Kind kind, uint64_t stream_limit,
               std::string channel, std::string peer, const endpoint::Hello& mine,
               const endpoint::Hello& theirs, Fd stop, Fd wake, Fd sends_wake, Fd events);

 private:
  friend class EndpointServer;  // runs the server's steps (server_wait ... serve_turn)

  // One of this side's requests waiting for its reply (kLent, kRenewed,
  // kReceiveHandle).
  struct AwaitedReply {
    bool for_send = false;  // a send's handle request: its arrival is a send event
    uint64_t send = 0;      // that send's id
    bool arrived = false;
    Status status;
    uint64_t value = 0;  // the lease granted, in ms
    std::vector<uint8_t> body;
  };
  // Memory this side lent to the peer.
  struct Lent {
    LocalMemory memory;
    RemoteBuffer handle;
    Deadline expires;
  };
  // How far one pump takes the frames of a ring (see lead()).
  enum class Take {
    kAll,           // all it holds
    kUpToAMessage,  // up to the first inline message, leaving those behind
    // As kUpToAMessage, under the caller's hold of mu_ throughout: stops
    // before a frame it would let go of mu_ for (a part, or a frame other
    // than a credit or an inline message). See look_leanly().
    kLeanly,
  };

  // --- lifecycle (endpoint.cc) ---
  Status usable();
  bool stopping();
  void break_with(const Status& why);
  void fail_reading(Status st);
  template <typename T>
  Result<T> take_next(std::deque<T>& queue, std::chrono::milliseconds timeout, const char* late);
  // Sends a request built with `id` filled in and waits for its reply.
  Result<AwaitedReply> call(Frame type, endpoint::Request request,
                            std::chrono::milliseconds timeout);

  // --- sends (sends.cc) ---
  bool answered_by_frames(const StateLock& lock, const LocalMemory& message);
  bool answered_by_frames(const LocalMemory& message, const Credit& credit) const {
    return message.size() <= channel_.stream_limit() || message.size() > credit.capacity;
  }
  bool send_work_ready(const StateLock& lock);
  Status send_in_frames(const Credit& credit, const LocalMemory& message);
  void progress_sends();
  bool send_queued_inline(StateLock& lock);
  void ask_for_handle(StateLock& lock, uint64_t id, endpoint::Outgoing& out);
  void take_handle(StateLock& lock, uint64_t id, endpoint::Outgoing& out);
  void start_write(StateLock& lock, uint64_t id, endpoint::Outgoing& out);
  void write_finished(uint64_t id);
  void conclude_write(StateLock& lock, uint64_t id, endpoint::Outgoing& out, Status wrote,
                      bool may_retry);
  void finish(const StateLock& lock, endpoint::Outgoing& out, Status status);
  void announce_done(const StateLock& lock);
  void cut_short(StateLock& lock, uint64_t id, endpoint::Outgoing& out);
  void cancel_writes();

  // --- receives (receives.cc) ---
  Result<uint64_t> post_receive(const LocalMemory& into, RemoteBuffer handle,
                                std::span<const uint8_t> handle_bytes, const LocalMemory& bounce);
  // Registers `into` for a one-sided message; GPU memory that no transport
  // reaches gets a host `bounce` of its size registered instead.
  Result<RemoteBuffer> register_receive(const LocalMemory& into, LocalMemory& bounce);
  Status answer_handle_request(uint64_t id, uint64_t seq);

  // --- writing (writing.cc) ---
  [[gnu::always_inline]] Status write_frame(FrameBuilder& builder,
                                            std::span<const uint8_t> tail = {}) {
    const std::span<const uint8_t> head = builder.done(tail.size());
    const std::span<const uint8_t> pieces[] = {head, tail};
    return write_pieces(pieces);
  }
  Status write_frame(FrameBuilder&& builder) { return write_frame(builder); }
  Status write_pieces(std::span<const std::span<const uint8_t>> pieces);
  Status broke_while_sending(const Status& st);
  Status write_blocking(std::span<const std::span<const uint8_t>> pieces);
  Status write_whole(std::span<const std::span<const uint8_t>> pieces);
  // Writes the credits held back, then `pieces`, into a channel whose writes
  // never wait, if it has room for them all now (mu_, its frames lock,
  // held): whether it did. `doorbell`: ring it once mu_ is free.
  Result<bool> try_write(const StateLock&, std::span<const std::span<const uint8_t>> pieces,
                         bool& doorbell) {
    Result<bool> wrote = channel_.try_write(credits_.held(), pieces, doorbell);
    if (wrote.ok() && *wrote) credits_.sent();
    return wrote;
  }
  Status wait_for_room(Deadline spin_until, Deadline deadline);
  void read_while_blocked();
  bool hold_credit(uint64_t seq, uint64_t capacity, std::span<const uint8_t> handle);
  Status flush();
  // Whether this thread is inside a blocking write of this endpoint's.
  bool writing_blocked_here() const;
  bool credits_go_when_idle() const { return channel_.cheap_writes() || credits_.due(); }

  // --- reading (reading.cc) ---
  Status pump(const ReaderRole::Held& role, bool& progressed, StateLock& lock,
              Take take = Take::kAll);
  Status pump(const ReaderRole::Held& role, bool& progressed);
  Status pump_holding_replies(const ReaderRole::Held& role, bool& progressed, StateLock& lock,
                              Take take);
  Status pump_frames(const ReaderRole::Held& role, bool& progressed, StateLock& lock, Take take);
  Result<bool> take_frames_in_place(const ReaderRole::Held& role, bool& progressed, StateLock& lock,
                                    Take take);
  Result<size_t> channel_bytes_to_copy(const ReaderRole::Held& role);
  Result<size_t> receive_some(const ReaderRole::Held& role, uint8_t* out, size_t size);
  Status dispatch(const ReaderRole::Held& role, Frame type, std::span<const uint8_t> payload);
  bool notes_full();
  bool may_look_leanly() const {
    return channel_.frames_in_place() && reading_.in_begin == reading_.in_end &&
           reading_.held_replies.empty();
  }
  bool channel_has_more() { return channel_.has_incoming() || reading_.peer_closed; }

  // --- progress: whoever waits reads (progress.cc; the templates below) ---
  template <typename Pred>
  bool await(StateLock& lock, WaitDeadline& deadline, Pred ready);
  template <typename Pred>
  bool look_leanly(StateLock& lock, Pred ready);
  template <typename Pred>
  bool lead(const ReaderRole::Held& role, StateLock& lock, WaitDeadline& deadline, Pred ready);
  // Wakes the callers asleep on cv_ (in await or cut_short): the state they
  // wait on changed. Costs nothing while none sleeps, as on the message path.
  void wake_sleepers(const StateLock&) {
    if (sleepers_ > 0) cv_.notify_all();
  }
  std::optional<ReaderRole::Held> take_role(bool until_released);
  void give_back_role();
  void release_role(const StateLock& lock);
  void relax(bool core_shared);
  bool sleep_on_channel(const ReaderRole::Held& role, Deadline deadline);
  void take_doorbells(const ReaderRole::Held& role);
  void watch_socket();

  // --- the endpoint's server (server.h; its steps in progress.cc) ---
  // The server's first look comes this long after callers last read, in
  // ms (progress.cc says why); server_wait's answer for "no wait".
  static constexpr int kLingerMs = 1;
  static constexpr int kNoWait = -2;
  // Starts the server on one of the manager's loops (create()).
  static Status start_serving(const std::shared_ptr<EndpointImpl>& endpoint);
  int server_wait();
  ServerLook server_look(int woken);
  void look_later();
  bool serve_turn(ServerLook look);
  bool end_serving();
  void served_out();

  // --- lending (lending.cc) ---
  Status answer_lend(uint64_t id, uint64_t size, std::chrono::milliseconds lease);
  Status answer_renew(uint64_t id, uint64_t buffer_id, std::chrono::milliseconds lease);
  Status take_buffer(RemoteBuffer buffer);
  void keep_leases();
  Status reply(Frame type, uint64_t id, const Status& status, uint64_t value,
               std::span<const uint8_t> body) {
    return write_frame(endpoint::reply_frame(type, id, status, value, body));
  }

  // --- notifications (notification_delivery.cc) ---
  Status take_notice(const endpoint::Notice& notice);
  void hand_over_notes();
  bool deliver_notes();

  endpoint::EndpointHost& host_;
  const std::chrono::microseconds busy_poll_ = host_.config().busy_poll;
  SpinStretch stretch_;  // the reader role's holder alone (lead)
  // The thread that made the endpoint may run on one CPU alone (its
  // affinity mask, its cgroup's quota): so may, in all likelihood, its
  // peer and the threads that wait on the endpoint.
  const bool one_cpu_ = usable_cpus() < 2;
  Fd fd_;  // the TCP connection: frames, or doorbells (or nothing) and its end
  FrameChannel channel_;
  Fd stop_;        // readable once closing
  Fd wake_;        // readable when the endpoint's server has work: notifications, sends
  Fd sends_wake_;  // readable when a send's write finished while a caller read
  Fd events_;      // epoll: stop_, wake_, and fd_ while no caller reads it
  const std::string peer_;
  const uint64_t peer_manager_id_;
  const uint64_t notice_key_;       // this side's (Hello)
  const uint64_t peer_notice_key_;  // the peer's: its notices name it

  // FutexMutex, not std::mutex: mu_ and write_mu_ are taken several times
  // per message (common/futex_mutex.h).
  FutexMutex mu_;                   // the state lock
  std::condition_variable_any cv_;  // callers waiting for the peer
  int sleepers_ = 0;                // waiting on cv_ now
  Status broken_;                   // OK while usable

  ReaderRole role_;
  // The reader role's holder alone: bytes read and not yet taken,
  // [in_begin, in_end) of in; the peer's end seen (frames_in_place
  // channels); replies held while it pumps, and how deep it is in writing
  // them (read_while_blocked).
  struct Reading {
    std::unique_ptr<uint8_t[]> in;
    size_t in_begin = 0;
    size_t in_end = 0;
    bool peer_closed = false;
    std::vector<uint8_t> held_replies;
    int reply_depth = 0;
  } reading_;

  endpoint::Credits credits_;
  endpoint::SendQueue sends_;
  endpoint::ReceiveTable receives_;
  std::map<uint64_t, AwaitedReply> replies_;  // our requests waiting for an answer
  uint64_t next_request_ = 0;
  std::deque<RemoteBuffer> remote_buffers_;  // handles the peer passed, not taken yet

  // Lent memory (lending.cc), under mu_; the lease keeper's wake-ups.
  std::map<uint64_t, Lent> lent_;  // by buffer id
  std::deque<LocalMemory> returned_;
  std::condition_variable_any leases_cv_;

  // Notifications (notification_delivery.cc): for the endpoint's server to
  // deliver, or a waiter that looked (hand_over_notes); under mu_. (Its
  // size, looked at in every wait, is a field: a deque's is a computation
  // over its blocks.)
  RingQueue<Notification> notes_;
  // Held by whoever hands notes_ to the manager's queue, so that they go
  // in order. Never taken under mu_.
  std::mutex deliver_mu_;
  // The reader role's holder is a waiter in next_notification
  // (look_for_notes), which hands over the notifications it reads itself.
  bool looking_ = false;
  std::atomic<bool> looked_{false};         // such a waiter read since looks_ended()
  std::atomic<bool> reader_wanted_{false};  // looks_ended(): the endpoint's server reads again

  FutexMutex write_mu_;                      // the frames lock where writes may wait (see above)
  std::vector<iovec> socket_pieces_;         // what one such write gathers (kept for its capacity)
  std::atomic<bool> serve_sleeping_{false};  // the server waits with no timeout
  // Frames-in-place channels: doorbells taken from the socket
  // (take_doorbells), and how many there were when the endpoint's server
  // last asked for one.
  std::atomic<uint64_t> doorbells_taken_{0};
  uint64_t doorbells_seen_ = 0;  // the server's steps alone
  // The server's steps alone (one at a time: server.h).
  struct ServerState {
    int timeout_ms = -1;        // the next wait's (-1: until an event comes)
    int linger_ms = kLingerMs;  // the next look's, while callers read
    int held_looks = 0;         // looks in a row that found the role held (serve_turn)
  } server_;
  // The server (start_serving); whether it takes no more steps
  // (served_out), under served_mu_, true until it starts: close() waits
  // for it.
  std::weak_ptr<EndpointServer> server_task_;
  std::mutex served_mu_;
  std::condition_variable served_cv_;
  bool served_out_ = true;
  // Held across close()'s join. Taken before threads_mu_, which guards the
  // lease keeper and joined_ (close() took it to join: none starts after),
  // never across a join.
  std::mutex join_mu_;
  std::mutex threads_mu_;
  bool joined_ = false;
  std::thread lease_keeper_;  // from the first loan on (lending.cc)
};

}  // namespace rdmabuf

#include "core/endpoint/progress_templates.h"
