#include "backends/ibverbs/notice_intake.h"

#include <poll.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>

#include "backends/ibverbs/handshake.h"
#include "common/log.h"
#include "common/strings.h"

namespace rdmabuf::ibverbs {
namespace {

static_assert(kNoticeSlot >= kNoticeBytes);
// How often notices the sink had no room for are offered again.
constexpr int kOfferAgainMs = 5;
// Pairs the first shared queue has room for.
constexpr uint32_t kFirstPairs = 16;
// A receive's work request id: the receiver's generation above, its slot below.
constexpr int kSlotBits = 32;

}  // namespace

// One pair's receives: its slots, and the notices taken from them that the
// sink has not taken yet, oldest first. The intake's thread owns its state,
// except `removed`, which mu guards; mu is held across every post to the
// pair, so that none comes after remove(). (The intake's mu_, where both
// are held, comes first.)
struct NoticeIntake::Receiver {
  std::mutex mu;
  bool removed = false;  // nothing touches the pair any more
  ibv_qp* qp = nullptr;
  uint64_t reader_id = 0;
  // Never the same as another receiver's of this intake while either is
  // added: a completion left from a pair whose number this one reuses is
  // not this one's.
  uint64_t generation = 0;
  std::unique_ptr<uint8_t[]> slots;
  std::shared_ptr<MemoryRegion> slots_mr;
  std::deque<std::pair<uint32_t, NoticeRecord>> held;
  bool failed = false;
  bool warned = false;
};

Result<std::shared_ptr<NoticeIntake>> NoticeIntake::create(std::shared_ptr<const Device> device,
                                                           NoticeSink* sink,
                                                           ResponderCounts* counts) {
  // A pair owes at most a completion per receive.
  RDMABUF_ASSIGN_OR_RETURN(auto cqs,
                           SharedCqs::create(std::move(device), kNoticeReceives, kFirstPairs));
  RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
  std::shared_ptr<NoticeIntake> intake(
      new NoticeIntake(std::move(cqs), std::move(stop), sink, counts));
  intake->thread_ = std::thread([raw = intake.get()] { raw->run(); });
  return intake;
}

NoticeIntake::NoticeIntake(SharedCqs cqs, Fd stop, NoticeSink* sink, ResponderCounts* counts)
    : stop_(std::move(stop)), sink_(sink), counts_(counts), cqs_(std::move(cqs)) {}

NoticeIntake::~NoticeIntake() {
  stop();
}

void NoticeIntake::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  signal_eventfd(stop_.get());
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // a notification handler that shuts its manager down: ends after it
  } else {
    thread_.join();
  }
}

Result<CqRoom> NoticeIntake::reserve() {
  std::lock_guard lock(mu_);
  return cqs_.reserve();
}

Status NoticeIntake::add(QueuePair& qp, uint64_t reader_id) {
  auto r = std::make_shared<Receiver>();
  r->qp = qp.qp();
  r->reader_id = reader_id;
  const size_t bytes = size_t{kNoticeReceives} * kNoticeSlot;
  r->slots = std::make_unique<uint8_t[]>(bytes);
  RDMABUF_ASSIGN_OR_RETURN(
      r->slots_mr, register_range(cqs_.device(), r->slots.get(), bytes, IBV_ACCESS_LOCAL_WRITE));
  std::lock_guard lock(mu_);
  std::lock_guard receiver(r->mu);
  r->generation = ++generations_;
  for (uint32_t slot = 0; slot < kNoticeReceives; ++slot) {
    repost_locked(*r, slot);
    if (r->failed) return Unavailable("cannot post the notices' receives");
  }
  receivers_[qp.qp()->qp_num] = std::move(r);
  return Status::Ok();
}

void NoticeIntake::remove(const QueuePair& qp) {
  std::shared_ptr<Receiver> r;
  {
    std::lock_guard lock(mu_);
    auto it = receivers_.find(qp.qp()->qp_num);
    if (it == receivers_.end()) return;
    r = std::move(it->second);
    receivers_.erase(it);
  }
  std::lock_guard lock(r->mu);  // waits for a post to the pair under way
  r->removed = true;
}

void NoticeIntake::run() {
  pthread_setname_np(pthread_self(), "rdmabuf-notices");
  bool held = false;
  for (;;) {
    pollfd fds[2] = {{cqs_.fd(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    const int rc = ::poll(fds, 2, held ? kOfferAgainMs : -1);
    if (rc < 0 && errno != EINTR) {
      RDMABUF_LOG_ERROR("ibverbs: notice intake: poll: " + errno_text(errno));
      return;
    }
    std::vector<std::shared_ptr<Receiver>> holding;
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      holding = take_locked();
    }
    // Outside mu_: the sink may run a notification handler.
    held = false;
    for (const auto& r : holding) {
      offer_held(*r);
      held |= !r->held.empty();
    }
  }
}

std::vector<std::shared_ptr<NoticeIntake::Receiver>> NoticeIntake::take_locked() {
  // Events acknowledged, every queue armed again, then polled empty: a
  // completion after the arming raises the next event.
  cqs_.take_events();
  cqs_.arm();
  cqs_.poll(
      [&](const ibv_wc& wc) {
        auto it = receivers_.find(wc.qp_num);
        if (it == receivers_.end()) return;    // its pair is gone
        std::lock_guard lock(it->second->mu);  // it may post again
        take_completion_locked(*it->second, wc);
      },
      // Its pairs take no more notices; the next ones go on another queue.
      [](ibv_cq*) {});
  std::vector<std::shared_ptr<Receiver>> holding;
  for (auto& [qp_num, r] : receivers_) {
    if (!r->held.empty()) holding.push_back(r);
  }
  return holding;
}

void NoticeIntake::take_completion_locked(Receiver& r, const ibv_wc& wc) {
  if ((wc.wr_id >> kSlotBits) != r.generation) return;  // an earlier pair's
  if (r.failed) return;                                 // flushed
  // The first error fails the intake (an access the reader was refused
  // fails both sides of the pair); the rest are flushes.
  if (wc.status != IBV_WC_SUCCESS) {
    return fail_locked(r, cqs_.device().lib().wc_status_str(wc.status));
  }
  const auto slot = static_cast<uint32_t>(wc.wr_id & 0xffffffff);
  if (slot >= kNoticeReceives) return fail_locked(r, "a receive of no slot completed");
  Result<NoticeRecord> notice =
      wc.opcode != IBV_WC_RECV
          ? Result<NoticeRecord>(ProtocolError("an RDMA WRITE with immediate, not a notice"))
          : decode_notice({r.slots.get() + size_t{slot} * kNoticeSlot, wc.byte_len});
  if (!notice.ok()) {
    refuse(r, notice.status());
    repost_locked(r, slot);
    return;
  }
  r.held.emplace_back(slot, std::move(notice).value());
}

void NoticeIntake::offer_held(Receiver& r) {
  while (!r.held.empty()) {
    auto& [slot, notice] = r.held.front();
    // No lock held: the sink may run a notification handler, which may do
    // anything, shutting its manager down included.
    Status taken = sink_ ? sink_->deliver(r.reader_id, notice)
                         : FailedPrecondition("this manager takes no notices");
    if (taken.code() == StatusCode::kResourceExhausted) return;  // again later
    if (taken.ok()) {
      counts_->notices++;
    } else {
      refuse(r, taken);
    }
    {
      std::lock_guard lock(r.mu);
      if (r.removed) return;  // its pair is going: nothing is posted to it
      repost_locked(r, slot);
    }
    r.held.pop_front();
  }
}

void NoticeIntake::repost_locked(Receiver& r, uint32_t slot) {
  if (r.failed) return;
  ibv_sge sge{reinterpret_cast<uintptr_t>(r.slots.get() + size_t{slot} * kNoticeSlot), kNoticeSlot,
              r.slots_mr->lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = (r.generation << kSlotBits) | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_recv(r.qp, &wr, &bad);
  if (rc != 0) fail_locked(r, "cannot post a receive: " + errno_text(rc));
}

void NoticeIntake::fail_locked(Receiver& r, const std::string& why) {
  if (r.failed) return;
  r.failed = true;
  RDMABUF_LOG_DEBUG("ibverbs: the queue pair of manager " + hex_id(r.reader_id) + " failed (" +
                    why + "); it takes no more notices");
}

void NoticeIntake::refuse(Receiver& r, const Status& why) {
  counts_->refused++;
  const std::string text =
      "ibverbs: dropped a notice from manager " + hex_id(r.reader_id) + ": " + why.to_string();
  if (!r.warned) {
    RDMABUF_LOG_WARN(text + " (further ones on this queue pair are logged at debug level)");
    r.warned = true;
  } else {
    RDMABUF_LOG_DEBUG(text);
  }
}

}  // namespace rdmabuf::ibverbs
