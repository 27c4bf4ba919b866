// The owner's intake of notices (handshake.h, "notice"): the SENDs readers
// post behind their tagged writes, into receives the owner keeps posted on
// its side of each reader's queue pair. Every pair's receives complete into
// completion queues shared by all the pairs of one device, and one thread
// polls them, hands each notice to the sink and posts its receive again.
// Neither grows with the number of readers.
//
// Notices go to the sink in the order each pair's receives complete. One
// the sink has no room for now is kept, with those after it on the same
// pair, in order, and offered again every few milliseconds; their receives
// are posted again only once the sink took them, so a reader that outruns
// the owner's application is held back by its NIC (receiver not ready,
// retried without end), and no notice is lost. A malformed one is dropped,
// counted and logged (once a pair); a SEND too large for a receive, or any
// failed receive, fails the pair's intake: it takes no more notices (the
// reader sets the pair up again when it next needs one).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/ibverbs/completion_queue.h"
#include "backends/ibverbs/device.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/socket.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::ibverbs {

// Receives kept posted on each owner-side pair, and the bytes of each: room
// for a notice and more, so that a SEND of the wrong size reads as
// malformed rather than failing the pair, up to this size.
constexpr uint32_t kNoticeReceives = 64;
constexpr uint32_t kNoticeSlot = 64;

// What the owner's side of the pairs counts, for BackendInfo.
struct ResponderCounts {
  std::atomic<int> live{0};             // pairs held for readers now
  std::atomic<uint64_t> handshakes{0};  // ever served
  std::atomic<uint64_t> notices{0};     // handed to the sink and taken
  std::atomic<uint64_t> refused{0};     // dropped: malformed, or refused by the sink
};

class NoticeIntake {
 public:
  // Notices go to `sink` (null: each is refused).
  static Result<std::shared_ptr<NoticeIntake>> create(std::shared_ptr<const Device> device,
                                                      NoticeSink* sink, ResponderCounts* counts);
  ~NoticeIntake();
  NoticeIntake(const NoticeIntake&) = delete;
  NoticeIntake& operator=(const NoticeIntake&) = delete;

  // Room for one pair's receives on a shared queue (QueuePair::Shared::kReceives,
  // with kNoticeReceives receives). Any thread.
  Result<CqRoom> reserve();
  // Posts kNoticeReceives receives on `qp` (made with a room from
  // reserve()) and takes the notices of manager `reader_id` that complete
  // on them, until remove(). Any thread.
  Status add(QueuePair& qp, uint64_t reader_id);
  // From its return nothing of the pair is touched (call before destroying
  // it); notices it held and the sink had not taken are dropped with it
  // (one being delivered still is).
  void remove(const QueuePair& qp);
  // Ends the thread (after the delivery under way, unless called from it);
  // later notices stay in their queues.
  void stop();

 private:
  struct Receiver;
  NoticeIntake(SharedCqs cqs, Fd stop, NoticeSink* sink, ResponderCounts* counts);
  void run();
  // With mu_ held: takes the completions that came; the receivers that
  // hold notices now.
  std::vector<std::shared_ptr<Receiver>> take_locked();
  // The intake's thread, with the receiver's mu held.
  void take_completion_locked(Receiver& r, const ibv_wc& wc);
  void repost_locked(Receiver& r, uint32_t slot);
  void fail_locked(Receiver& r, const std::string& why);
  // The intake's thread, with no lock held: hands the notices `r` holds to
  // the sink, in order, until it has no room.
  void offer_held(Receiver& r);
  void refuse(Receiver& r, const Status& why);

  const Fd stop_;  // eventfd
  NoticeSink* const sink_;
  ResponderCounts* const counts_;
  std::thread thread_;

  // Guards what follows; the thread holds it while it polls (not while
  // the sink runs).
  std::mutex mu_;
  SharedCqs cqs_;  // (its fd() and device() need no lock)
  std::unordered_map<uint32_t, std::shared_ptr<Receiver>> receivers_;  // by qp_num
  uint64_t generations_ = 0;  // the receivers' (Receiver::generation)
  bool stopped_ = false;
};

}  // namespace rdmabuf::ibverbs
