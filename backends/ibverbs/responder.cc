#include "backends/ibverbs/responder.h"

#include <fcntl.h>
#include <poll.h>

#include <deque>
#include <memory>
#include <utility>

#include "backends/ibverbs/handshake.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/log.h"
#include "common/strings.h"

namespace rdmabuf::ibverbs {
namespace {

// How long a reader may take to ask for a queue pair.
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
// The owner's side of a pair never posts: a shallow send queue is enough.
constexpr uint32_t kResponderDepth = 16;
// Receives kept posted for notices, and the bytes of each: room for a
// notice and more, so that a SEND of the wrong size reads as malformed
// rather than failing the pair, up to this size.
constexpr uint32_t kNoticeReceives = 64;
constexpr uint32_t kNoticeSlot = 64;
static_assert(kNoticeSlot >= kNoticeBytes);
// How often notices the sink had no room for are offered again.
constexpr int kOfferAgainMs = 5;

// A completion channel whose descriptor does not block.
struct CompChannel {
  const IbvLib& lib;
  ibv_comp_channel* channel = nullptr;
  ~CompChannel() {
    if (channel) lib.destroy_comp_channel(channel);
  }
};

class Responder {
 public:
  Responder(Fd fd, const ResponderContext& context)
      : context_(context), lib_(context.device->lib()), fd_(std::move(fd)), events_{lib_} {}

  void run() {
    if (!handshake()) return;
    ResponderCounts& counts = *context_.counts;
    counts.handshakes++;
    counts.live++;
    serve();
    context_.access->revoke_all(grants_);
    counts.live--;
    // The pair goes here: the reader's next work request on it fails.
  }

 private:
  // Reads the reader's request and answers it with this side's end of the
  // pair, or why not. True when the pair is connected.
  bool handshake() {
    const Deadline deadline = Clock::now() + kHandshakeTimeout;
    auto request = read_connect(fd_.get(), deadline, context_.stop_fd);
    if (!request.ok()) {
      RDMABUF_LOG_DEBUG("ibverbs: dropping a handshake: " + request.status().message());
      return false;
    }
    Status refused = check_claim(request->claim);
    if (!refused.ok()) {
      RDMABUF_LOG_DEBUG("ibverbs: refused a queue pair to manager " + hex_id(context_.reader_id) +
                        ": " + refused.message());
    } else if (request->device != context_.device->name()) {
      refused = FailedPrecondition("this owner has no RDMA device '" + request->device +
                                   "' (it uses " + context_.device->name() + ")");
    } else {
      refused = create_pair();
      if (refused.ok()) refused = qp_->connect(request->endpoint);
    }
    Endpoint mine = qp_ ? qp_->local() : Endpoint{};
    return send_accepted(fd_.get(), refused, mine, deadline, context_.stop_fd).ok() && refused.ok();
  }

  // The pair, in INIT, with every notice receive posted and its completion
  // events armed.
  Status create_pair() {
    events_.channel = lib_.create_comp_channel(context_.device->context());
    if (!events_.channel) {
      return ResourceExhausted("cannot create a completion channel: " + errno_text(errno));
    }
    const int flags = ::fcntl(events_.channel->fd, F_GETFL);
    if (flags < 0 || ::fcntl(events_.channel->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
      return Internal("fcntl: " + errno_text(errno));
    }
    const size_t bytes = size_t{kNoticeReceives} * kNoticeSlot;
    slots_ = std::make_unique<uint8_t[]>(bytes);
    RDMABUF_ASSIGN_OR_RETURN(
        slots_mr_, register_range(*context_.device, slots_.get(), bytes, IBV_ACCESS_LOCAL_WRITE));
    QueuePair::Shape shape;
    shape.send_depth = kResponderDepth;
    shape.receive_depth = kNoticeReceives;
    shape.receive_events = events_.channel;
    RDMABUF_ASSIGN_OR_RETURN(qp_, QueuePair::create(*context_.device, shape));
    for (uint32_t slot = 0; slot < kNoticeReceives; ++slot)
      RDMABUF_RETURN_IF_ERROR(post_receive(slot));
    if (ibv_req_notify_cq(qp_->recv_cq(), 0) != 0) {
      return Internal("cannot arm the receive queue's completion events");
    }
    return Status::Ok();
  }

  Status post_receive(uint32_t slot) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(slots_.get() + size_t{slot} * kNoticeSlot), kNoticeSlot,
                slots_mr_->lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    const int rc = ibv_post_recv(qp_->qp(), &wr, &bad);
    return rc == 0 ? Status::Ok() : Unavailable("cannot post a receive: " + errno_text(rc));
  }

  // Answers questions and takes notices until the reader is done with the
  // pair (closes the connection) or the backend stops. A pair that failed
  // takes no more notices, but its questions are still answered: a reader
  // whose access was refused (which fails this side of the pair too) asks
  // whether the buffer was released before it lets go (Connection::explain).
  void serve() {
    while (!context_.stopping->load()) {
      pollfd fds[3] = {{fd_.get(), POLLIN, 0},
                       {context_.stop_fd, POLLIN, 0},
                       {pair_failed_ ? -1 : events_.channel->fd, POLLIN, 0}};
      const int rc = ::poll(fds, 3, held_.empty() ? -1 : kOfferAgainMs);
      if (rc < 0 && errno != EINTR) return;
      if (context_.stopping->load()) return;
      if (rc > 0 && fds[0].revents != 0 && !answer_query()) return;
      if (rc > 0 && fds[2].revents != 0 && !rearm()) fail_pair("cannot arm its completion events");
      if (!pair_failed_) take_notices();
      offer_held();
    }
  }

  // From now on the pair takes no notices (its receives were flushed, or
  // one of them failed): those it took before still go to the sink.
  void fail_pair(const std::string& why) {
    if (pair_failed_) return;
    pair_failed_ = true;
    RDMABUF_LOG_DEBUG("ibverbs: the queue pair of manager " + hex_id(context_.reader_id) +
                      " failed (" + why + "); it takes no more notices");
  }

  // Whether the owner has the buffer a handle claims: its id, token and
  // size (OK, or why not).
  Status check_claim(const HandleClaim& claim) {
    auto pinned = context_.resolver->pin(claim.id, claim.token, nullptr);
    if (!pinned.ok()) return pinned.status();
    if (pinned->size() != claim.region_size) {
      return InvalidArgument("the handle's buffer size does not match the owner's");
    }
    return Status::Ok();
  }

  // One request for access to a buffer (the descriptor is readable): false
  // when the reader closed the connection. Granted to a genuine handle on a
  // pair that works: the key that opens the buffer to this pair.
  bool answer_query() {
    auto query = read_query(fd_.get(), context_.stop_fd);
    if (!query.ok()) return false;  // the reader is done with the pair (or we stop)
    BufferAnswer answer{query->id, StatusCode::kOk, 0};
    Status checked = check_claim(*query);
    if (checked.ok()) {
      auto key = context_.access->grant(query->id, *qp_, grants_);
      if (key.ok()) {
        answer.rkey = *key;
      } else {
        checked = key.status();
      }
    }
    answer.code = checked.code();
    return send_answer(fd_.get(), answer, context_.stop_fd).ok();
  }

  // Takes the completion events that came and arms for the next: completions
  // after this make the descriptor readable again (take_notices() polls
  // right after, for those before).
  bool rearm() {
    ibv_cq* cq = nullptr;
    void* unused = nullptr;
    while (lib_.get_cq_event(events_.channel, &cq, &unused) == 0)  // EAGAIN ends it
      lib_.ack_cq_events(cq, 1);
    return ibv_req_notify_cq(qp_->recv_cq(), 0) == 0;
  }

  // Reads the receives that completed: each notice joins held_, in order.
  void take_notices() {
    ibv_wc wc[16];
    int n;
    do {
      n = ibv_poll_cq(qp_->recv_cq(), 16, wc);
      if (n < 0) return fail_pair("ibv_poll_cq failed");
      for (int i = 0; i < n; ++i) {
        // The first error fails the pair (an access the reader was refused
        // fails both sides); the rest are flushes.
        if (wc[i].status != IBV_WC_SUCCESS) return fail_pair(lib_.wc_status_str(wc[i].status));
        const auto slot = static_cast<uint32_t>(wc[i].wr_id);
        Result<NoticeRecord> notice =
            wc[i].opcode != IBV_WC_RECV
                ? Result<NoticeRecord>(ProtocolError("an RDMA WRITE with immediate, not a notice"))
                : decode_notice({slots_.get() + size_t{slot} * kNoticeSlot, wc[i].byte_len});
        if (!notice.ok()) {
          refuse(notice.status());
          repost(slot);
          continue;
        }
        held_.emplace_back(slot, std::move(notice).value());
      }
    } while (n == 16);
  }

  // Hands the notices held to the sink, oldest first, until it has no room;
  // each one's receive is posted again once it is taken (or refused).
  void offer_held() {
    while (!held_.empty()) {
      auto& [slot, notice] = held_.front();
      Status taken = context_.notices ? context_.notices->deliver(context_.reader_id, notice)
                                      : FailedPrecondition("this manager takes no notices");
      if (taken.code() == StatusCode::kResourceExhausted) return;  // again later
      if (taken.ok()) {
        context_.counts->notices++;
      } else {
        refuse(taken);
      }
      repost(slot);
      held_.pop_front();
    }
  }

  void repost(uint32_t slot) {
    if (pair_failed_) return;
    Status posted = post_receive(slot);
    if (!posted.ok()) fail_pair(posted.message());
  }

  void refuse(const Status& why) {
    context_.counts->refused++;
    const std::string text = "ibverbs: dropped a notice from manager " +
                             hex_id(context_.reader_id) + ": " + why.to_string();
    if (!warned_) {
      RDMABUF_LOG_WARN(text + " (further ones on this queue pair are logged at debug level)");
      warned_ = true;
    } else {
      RDMABUF_LOG_DEBUG(text);
    }
  }

  const ResponderContext& context_;
  const IbvLib& lib_;
  Fd fd_;
  // Teardown in reverse: the pair, then the receives' memory, then the
  // channel its completion queue reports to.
  CompChannel events_;
  std::unique_ptr<uint8_t[]> slots_;
  std::shared_ptr<MemoryRegion> slots_mr_;
  std::unique_ptr<QueuePair> qp_;
  // The access this pair was granted: revoked before the pair goes.
  Grants grants_;
  // Notices taken from their receives and not yet by the sink, oldest
  // first, with their receive slots.
  std::deque<std::pair<uint32_t, NoticeRecord>> held_;
  bool pair_failed_ = false;
  bool warned_ = false;
};

}  // namespace

void serve_responder(Fd fd, const ResponderContext& context) {
  Responder(std::move(fd), context).run();
}

}  // namespace rdmabuf::ibverbs
