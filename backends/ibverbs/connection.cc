#include "backends/ibverbs/connection.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cerrno>

#include "backends/ibverbs/handshake.h"
#include "common/log.h"
#include "common/op_text.h"

namespace rdmabuf::ibverbs {
namespace {

// Work requests posted with one ibv_post_send.
constexpr int kPostBatch = 32;
// Every this many work requests one is signalled (and always the last of
// a post), so completions stay few and the queue always drains.
constexpr uint64_t kSignalEvery = 16;
// How long a drain may take before the queue pair is destroyed instead.
constexpr auto kDrainLimit = std::chrono::seconds(5);
// How long the owner may leave a question about a buffer unanswered before
// its queue pair is reset; and how long a failed request waits for the
// owner's explanation.
constexpr auto kAnswerLimit = std::chrono::seconds(10);
constexpr auto kExplainLimit = std::chrono::seconds(2);
// How long the oldest posted request may go without completing before the
// owner is asked whether its buffer is still there (check_stalled()).
constexpr auto kStallLimit = std::chrono::seconds(1);
// While requests are in flight or questions out, the loop looks at the
// pair this often for cancelled transfers and stalls.
constexpr auto kCheckEvery = std::chrono::milliseconds(1);
// Passes one run of a pair makes before the loop's other pairs get a turn.
constexpr int kRoundsPerRun = 8;

bool is_refusal(const Status& answer) {
  return refuses_claim(answer.code());
}

void sleep_for(std::chrono::nanoseconds d) {
  timespec ts{0, static_cast<long>(d.count())};
  ::nanosleep(&ts, nullptr);
}

}  // namespace

Connection::Connection(ConnectionContext context, EventLoop& loop,
                       std::shared_ptr<LoopCompletions> completions)
    : context_(std::move(context)), loop_(loop), completions_(std::move(completions)) {}

Connection::~Connection() {
  // Only once the loop is done with it (it holds a reference while it may
  // run it, and while it watches the control connection): nothing polls
  // for the pair any more, if one is left.
  wait_for_handshaker();
}

void Connection::wait_for_handshaker() {
  std::shared_ptr<Handshake> shaking;
  {
    std::lock_guard lock(handshaker_mu_);
    shaking.swap(shaking_);
  }
  if (!shaking) return;
  std::unique_lock lock(shaking->mu);
  shaking->ended_cv.wait(lock, [&] { return shaking->ended; });
}

void Connection::enqueue(std::vector<Chunk>& chunks) {
  if (inbox_.push(chunks, loop_, this)) return;
  for (Chunk& c : chunks)
    complete(c, Cancelled("the manager is shutting down"));
  chunks.clear();
}

void Connection::stop() {
  for (Chunk& c : inbox_.stop(loop_, this))
    complete(c, Cancelled("the manager is shutting down"));
  wait_for_handshaker();  // the backend's stop signal ends it
}

bool Connection::idle() {
  return inbox_.idle();
}

bool Connection::take_incoming() {
  return inbox_.take(pending_);
}

Status Connection::health() const {
  std::lock_guard lock(health_mu_);
  if (!failure_.ok() && Clock::now() < retry_at_) return failure_;
  return Status::Ok();
}

void Connection::complete(Chunk& chunk, const Status& status) {
  TransferState& t = *chunk.transfer;
  if (status.ok() || t.cancelled()) {
    t.complete_part(chunk.op, status);
  } else {
    t.complete_part(chunk.op,
                    Status(status.code(), describe_op(t.op(chunk.op)) + ": " + status.message()));
  }
  chunk.transfer.reset();
}

void Connection::fail_pending(const Status& status) {
  for (Chunk& c : pending_)
    complete(c, status);
  pending_.clear();
}

bool Connection::touch(TransferState* t) {
  uint32_t& n = touching_[t];
  if (n == 0 && !t->begin_touch()) {
    touching_.erase(t);
    return false;
  }
  ++n;
  return true;
}

void Connection::untouch(TransferState* t) {
  auto it = touching_.find(t);
  if (it == touching_.end()) return;
  if (--it->second == 0) {
    touching_.erase(it);
    t->end_touch();
  }
}

void Connection::finish_posted(Posted& p, const Status& status) {
  // The NIC is done with this memory: the completion (or the drain) says so.
  untouch(p.chunk.transfer.get());
  if (p.chunk.notice && status.ok()) p.chunk.transfer->mark_notice_sent(p.chunk.op);
  complete(p.chunk, status);
  p.region.reset();
}

// --- the loop ---------------------------------------------------------------

void Connection::on_run(EventLoop& loop) {
  if (take_incoming() || context_.stopping->load(std::memory_order_acquire)) {
    shut_down();
    return;
  }
  if (handshake_ && !finish_handshake()) return;  // it kicks the loop when done
  // Answers, or the owner closing the connection: the loop runs this for
  // the descriptor turning readable. (step() reads too while questions
  // are out.)
  if (qp_ && loop.ready_fd() == control_.get()) read_answers();
  for (int round = 0;; ++round) {
    if (!qp_) {
      if (!pending_.empty() && !handshake_) begin_handshake();
      break;
    }
    if (!step()) break;
    if (round + 1 == kRoundsPerRun) {  // let the loop's other pairs run
      loop.kick(shared_from_this());
      break;
    }
    if (take_incoming()) {
      shut_down();
      return;
    }
  }
  settle();
}

bool Connection::step() {
  if (queue_failed_) {
    reset(0, Unavailable("the queue pair's completion queue failed"));
    return true;
  }
  bool progressed = post();
  progressed |= poll();
  if (qp_ && !asked_.empty()) progressed |= read_answers();
  if (!parked_.empty()) progressed |= drop_cancelled_parked();
  progressed |= cancel_if_needed();
  if (qp_ && !posted_.empty()) {
    check_stalled();
    progressed |= !qp_;  // it reset the pair: what is left goes on a new one
  }
  return progressed;
}

void Connection::settle() {
  // The loop polls busy for a while after new work; then it sleeps until
  // a completion's event.
  if (qp_ && posted_now_) completions_->expect();
  posted_now_ = false;
  if (control_.valid() && !control_watched_) {
    // An owner that dies closes it at once, while its NIC's silence shows
    // only after the transport's retries; and answers arrive on it.
    control_watched_ = loop_.watch(shared_from_this(), control_.get(), EPOLLIN).ok();
  }
  const bool waiting = !posted_.empty() || !parked_.empty() || !asked_.empty();
  // Cancellations and stalls are noticed within kCheckEvery.
  loop_.wake_at(shared_from_this(), waiting ? Clock::now() + kCheckEvery : Deadline::max());
  inbox_.set_busy(qp_ != nullptr || handshake_ != nullptr || !pending_.empty());
  // Work left without a pair (the last round reset it): a handshake next.
  if (!qp_ && !handshake_ && !pending_.empty()) loop_.kick(shared_from_this());
}

void Connection::shut_down() {
  if (qp_) reset(0, Cancelled("the manager is shutting down"));
  for (Posted& p : posted_)
    finish_posted(p, Cancelled("the manager is shutting down"));
  posted_.clear();
  fail_pending(Cancelled("the manager is shutting down"));
  close_control();
  handshake_.reset();  // its thread's pair goes with it
  loop_.wake_at(shared_from_this(), Deadline::max());
  inbox_.set_busy(false);
}

void Connection::close_control() {
  if (control_watched_) loop_.unwatch(control_.get());
  control_watched_ = false;
  control_.reset();
}

void Connection::queue_failed(ibv_cq* cq) {
  if (!qp_ || qp_->cq() != cq) return;
  queue_failed_ = true;
  loop_.kick(shared_from_this());
}

void Connection::take_completion(const ibv_wc& wc) {
  // A completion of an earlier pair whose number this one reuses (one
  // destroyed before it drained) is not this pair's.
  if ((wc.wr_id >> kGenerationShift) != generation_) return;
  arrived_.push_back(wc);
}

bool Connection::post() {
  ibv_send_wr wrs[kPostBatch];
  ibv_sge sges[kPostBatch][kMaxGather];
  int n = 0;
  bool progressed = false;
  Status control_failure;  // the queue pair is reset once what was built is posted
  while (!pending_.empty() && posted_.size() < qp_->depth() && n < kPostBatch) {
    Chunk& c = pending_.front();
    TransferState* t = c.transfer.get();
    if (t->cancelled()) {  // never posted: nothing to drain
      complete(c, Cancelled("cancelled before it was posted"));
      pending_.pop_front();
      progressed = true;
      continue;
    }
    const RemoteBuffer& remote = t->op(c.op).remote;
    const Validated* granted = validated(remote);
    if (!granted) {
      // Never posted before the owner confirms the handle.
      const uint64_t id = remote.id();
      Status asked = ask(remote);
      parked_[id].push_back(std::move(c));
      pending_.pop_front();
      progressed = true;
      if (!asked.ok()) {
        control_failure = Unavailable("cannot ask the owner about buffer " + std::to_string(id) +
                                      ": " + asked.message());
        break;
      }
      continue;
    } else if (!granted->answer.ok()) {
      complete(c, granted->answer);
      pending_.pop_front();
      progressed = true;
      continue;
    }
    ibv_sge* sge = sges[n];
    ibv_send_wr& wr = wrs[n];
    wr = {};
    wr.wr_id = next_wr_;
    wr.sg_list = sge;
    wr.num_sge = 1;
    auto region = c.notice ? build_notice(c, wr, sge[0]) : acquire_region(c);
    if (!region.ok()) {
      complete(c, region.status());
      pending_.pop_front();
      progressed = true;
      continue;
    }
    if (!touch(t)) {
      complete(c, Cancelled("cancelled before it was posted"));
      pending_.pop_front();
      progressed = true;
      continue;
    }
    ++next_wr_;
    if (!c.notice) {
      const uint32_t lkey = (*region)->lkey();
      if (c.pieces.empty()) {
        sge[0] = {reinterpret_cast<uint64_t>(c.local), c.length, lkey};
      } else {
        for (size_t k = 0; k < c.pieces.size(); ++k)
          sge[k] = {reinterpret_cast<uint64_t>(c.pieces[k].at), c.pieces[k].length, lkey};
        wr.num_sge = static_cast<int>(c.pieces.size());
      }
      wr.opcode = c.kind == OpKind::kReadIntoLocal ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      wr.wr.rdma.remote_addr = c.remote_addr;
      wr.wr.rdma.rkey = granted->rkey;
    }
    if (wr.wr_id % kSignalEvery == 0) wr.send_flags |= IBV_SEND_SIGNALED;
    if (n > 0) wrs[n - 1].next = &wr;
    posted_.push_back(Posted{std::move(c), std::move(region).value(), wr.wr_id,
                             (wr.send_flags & IBV_SEND_SIGNALED) != 0});
    pending_.pop_front();
    ++n;
  }
  if (n == 0) {
    if (!control_failure.ok()) reset(0, control_failure);
    return progressed;
  }
  wrs[n - 1].send_flags |= IBV_SEND_SIGNALED;  // the last is always signalled
  posted_.back().signalled = true;
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(qp_->qp(), wrs, &bad);
  if (rc != 0) {
    // Not posted from `bad` on: the queue pair is unusable. Its posted work
    // drains below; what was not posted goes back to the front, in order.
    uint64_t first_unposted = bad ? bad->wr_id : wrs[0].wr_id;
    while (!posted_.empty() && posted_.back().wr_id >= first_unposted) {
      Posted p = std::move(posted_.back());
      posted_.pop_back();
      untouch(p.chunk.transfer.get());
      pending_.push_front(std::move(p.chunk));
    }
    reset(0, Unavailable("ibv_post_send: " + errno_text(rc > 0 ? rc : errno)));
    return true;
  }
  posted_now_ = true;
  if (!control_failure.ok()) reset(0, control_failure);
  return true;
}

Result<std::shared_ptr<MemoryRegion>> Connection::acquire_region(const Chunk& chunk) {
  const LocalMemory& memory = chunk.transfer->op(chunk.op).local;
  if (chunk.pieces.empty())
    return context_.registrations->acquire(memory, chunk.local, chunk.length);
  // One registration spanning every piece (all within the op's local memory).
  std::byte* low = chunk.pieces.front().at;
  std::byte* high = low;
  for (const LocalPiece& piece : chunk.pieces) {
    low = std::min(low, piece.at);
    high = std::max(high, piece.at + piece.length);
  }
  return context_.registrations->acquire(memory, low, static_cast<size_t>(high - low));
}

Result<std::shared_ptr<MemoryRegion>> Connection::build_notice(const Chunk& chunk, ibv_send_wr& wr,
                                                               ibv_sge& sge) {
  if (!notice_region_) {
    const size_t bytes = size_t{kPairDepth} * kNoticeBytes;
    notice_slots_ = std::make_unique<uint8_t[]>(bytes);
    RDMABUF_ASSIGN_OR_RETURN(notice_region_, register_range(*context_.device, notice_slots_.get(),
                                                            bytes, IBV_ACCESS_LOCAL_WRITE));
  }
  const TransferState& t = *chunk.transfer;
  const RemoteBuffer& remote = t.op(chunk.op).remote;
  NoticeRecord record;
  record.tag = t.notice(chunk.op)->tag;
  record.endpoint_key = t.notice(chunk.op)->endpoint_key;
  record.buffer_id = remote.id();
  record.offset = remote.offset();
  record.length = t.op(chunk.op).bytes();
  record.token = remote.token();
  const std::array<uint8_t, kNoticeBytes> bytes = encode_notice(record);
  uint8_t* slot = notice_slots_.get() + (wr.wr_id % qp_->depth()) * kNoticeBytes;
  std::copy(bytes.begin(), bytes.end(), slot);
  sge.addr = reinterpret_cast<uint64_t>(slot);
  sge.length = static_cast<uint32_t>(kNoticeBytes);
  sge.lkey = notice_region_->lkey();
  wr.opcode = IBV_WR_SEND;
  if (qp_->inline_bytes() >= kNoticeBytes) wr.send_flags |= IBV_SEND_INLINE;
  return notice_region_;
}

bool Connection::poll() {
  if (posted_.empty()) return false;
  completions_->poll(this);
  if (arrived_.empty()) return false;
  std::vector<ibv_wc> wc;
  wc.swap(arrived_);
  const size_t n = wc.size();
  for (size_t i = 0; i < n; ++i) {
    completed_through_ = std::max(completed_through_, wc[i].wr_id);
  }
  for (size_t i = 0; i < n; ++i) {
    if (wc[i].status == IBV_WC_SUCCESS) {
      // In order: this and every earlier (unsignalled) request are done.
      while (!posted_.empty() && posted_.front().wr_id <= wc[i].wr_id) {
        finish_posted(posted_.front(), Status::Ok());
        posted_.pop_front();
      }
      continue;
    }
    // The first error is the root cause; the queue pair is in error now and
    // flushes everything after it (those flushes may be in this very batch:
    // completed_through_ has counted them). Those before it completed.
    while (!posted_.empty() && posted_.front().wr_id < wc[i].wr_id) {
      finish_posted(posted_.front(), Status::Ok());
      posted_.pop_front();
    }
    const bool ours = !posted_.empty() && posted_.front().wr_id == wc[i].wr_id;
    reset(ours ? wc[i].wr_id : 0,
          Unavailable(std::string("work request failed: ") +
                      context_.device->lib().wc_status_str(wc[i].status)),
          wc[i].status);
    return true;
  }
  return true;
}

const Connection::Validated* Connection::validated(const RemoteBuffer& remote) const {
  auto it = validated_.find(remote.id());
  if (it == validated_.end() || it->second.claim != HandleClaim::of(remote)) return nullptr;
  return &it->second;
}

const Status* Connection::answer_about(const RemoteBuffer& remote) const {
  const Validated* v = validated(remote);
  return v ? &v->answer : nullptr;
}

Status Connection::ask(const RemoteBuffer& remote) {
  const HandleClaim claim = HandleClaim::of(remote);
  for (const Query& q : asked_) {
    if (q.claim == claim) return Status::Ok();
  }
  // 40 bytes: the socket takes them at once unless the connection is dead.
  RDMABUF_RETURN_IF_ERROR(
      send_query(control_.get(), claim, Clock::now() + kAnswerLimit, context_.stop_fd));
  asked_.push_back(Query{next_query_++, claim, Clock::now()});
  return Status::Ok();
}

Status Connection::take_answers() {
  for (;;) {
    ssize_t n = ::recv(control_.get(), answer_bytes_.data() + answer_have_,
                       answer_bytes_.size() - answer_have_, MSG_DONTWAIT);
    if (n == 0) return Unavailable("the owner closed the queue pair");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      return Unavailable("the owner's control connection failed: " + errno_text(errno));
    }
    answer_have_ += static_cast<size_t>(n);
    if (answer_have_ < answer_bytes_.size()) continue;
    answer_have_ = 0;
    RDMABUF_ASSIGN_OR_RETURN(BufferAnswer a, parse_answer(answer_bytes_));
    if (asked_.empty() || asked_.front().claim.id != a.id) {
      return ProtocolError("the owner answered a question about buffer " + std::to_string(a.id) +
                           " that was not asked");
    }
    const Query q = asked_.front();
    asked_.pop_front();
    Status answer;
    switch (a.code) {
      case StatusCode::kOk:
        break;
      case StatusCode::kNotFound:
        answer = NotFound("the owner does not have this buffer");
        break;
      case StatusCode::kPermissionDenied:
        answer = PermissionDenied("the owner refused the handle's token");
        break;
      case StatusCode::kInvalidArgument:
        answer = InvalidArgument("the handle's buffer size does not match the owner's");
        break;
      case StatusCode::kUnavailable:
      case StatusCode::kResourceExhausted:
        answer = Status(a.code, "the owner could not open the buffer to this queue pair");
        break;
      default:
        return ProtocolError("the owner answered about buffer " + std::to_string(a.id) +
                             " with code " + std::to_string(static_cast<int>(a.code)));
    }
    // Ids are never reused: a refusal stays true, a grant holds while this
    // pair does, unless the buffer is released (see validated_).
    validated_[q.claim.id] = Validated{q.claim, answer, a.rkey};
    // The handle's chunks go first, in their order: they have waited.
    auto parked = parked_.find(q.claim.id);
    if (parked != parked_.end()) {
      for (auto it = parked->second.rbegin(); it != parked->second.rend(); ++it)
        pending_.push_front(std::move(*it));
      parked_.erase(parked);
    }
  }
}

bool Connection::read_answers() {
  const size_t asked = asked_.size();
  Status taken = take_answers();
  if (!taken.ok()) {
    reset(0, taken);
    return true;
  }
  if (!asked_.empty() && Clock::now() - asked_.front().sent > kAnswerLimit) {
    reset(0, Unavailable("the owner did not answer about buffer " +
                         std::to_string(asked_.front().claim.id) + " within 10 s"));
    return true;
  }
  return asked_.size() != asked;  // answered: chunks may wait in pending_
}

bool Connection::drop_cancelled_parked() {
  bool dropped = false;
  for (auto& [id, chunks] : parked_) {
    auto cancelled = [](const Chunk& c) { return c.transfer->cancelled(); };
    auto from = std::stable_partition(chunks.begin(), chunks.end(),
                                      [&](const Chunk& c) { return !cancelled(c); });
    for (auto it = from; it != chunks.end(); ++it)
      complete(*it, Cancelled("cancelled while the owner was asked about the buffer"));
    dropped |= from != chunks.end();
    chunks.erase(from, chunks.end());
  }
  return dropped;
}

Status Connection::explain(ibv_wc_status status, const Chunk& chunk) {
  const char* what = context_.device->lib().wc_status_str(status);
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR: {
      // The owner's NIC refused the key or the range. Ask the owner whether
      // the buffer is still there, so that a released buffer reads as
      // NotFound, as over every transport. (The control connection is
      // closed right after this, so an answer that comes too late confuses
      // nobody.)
      const RemoteBuffer& remote = chunk.transfer->op(chunk.op).remote;
      validated_.erase(remote.id());
      const uint64_t mine = next_query_;
      const Deadline until = Clock::now() + kExplainLimit;
      const bool could_ask = control_.valid();
      Status waited = could_ask ? ask(remote) : Unavailable("no control connection");
      while (waited.ok() && !asked_.empty() && asked_.front().seq <= mine) {
        waited = wait_fd(control_.get(), POLLIN, until, context_.stop_fd);
        if (waited.ok()) waited = take_answers();
      }
      // An answer read before the connection ended counts (validated_ held
      // none for it when asked).
      const Status* owner = answer_about(remote);
      if (!owner && could_ask && waited.code() == StatusCode::kUnavailable) {
        // The owner's end closed or failed, unanswered: an owner that died
        // deregisters its memory before its queue pair goes, so its NIC
        // refuses the access first.
        return Unavailable(std::string("the owner's NIC refused the access (") + what +
                           ") and the owner is gone: " + waited.message());
      }
      if (owner && owner->code() == StatusCode::kNotFound) {
        // Remembered: later ops on this handle fail without a round trip.
        Status gone = NotFound("the owner released this buffer");
        validated_[remote.id()] = Validated{HandleClaim::of(remote), gone, 0};
        return gone;
      }
      if (owner && owner->code() == StatusCode::kPermissionDenied) return *owner;
      return PermissionDenied(std::string("the owner's NIC refused the access (") + what +
                              "): the handle's key or range does not match the registration");
    }
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return Unavailable(std::string("the owner stopped answering (") + what + ")");
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      return Internal(std::string("local memory was refused by the NIC (") + what + ")");
    default:
      return Unavailable(std::string("work request failed: ") + what);
  }
}

void Connection::check_stalled() {
  const Clock::time_point now = Clock::now();
  if (posted_.front().wr_id != watched_wr_) {
    watched_wr_ = posted_.front().wr_id;
    watched_since_ = now;
    stall_asked_ = false;
    return;
  }
  if (now - watched_since_ < kStallLimit) return;
  // Completions come in order and only for signalled requests: the one
  // that holds the queue up is at or before the first signalled one.
  auto suspects_end =
      std::find_if(posted_.begin(), posted_.end(), [](const Posted& p) { return p.signalled; });
  if (suspects_end != posted_.end()) ++suspects_end;
  auto remote_of = [](const Posted& p) -> const RemoteBuffer& {
    return p.chunk.transfer->op(p.chunk.op).remote;
  };
  if (!stall_asked_) {
    // Their owner's confirmations are forgotten: the next answers are about
    // now. (New chunks for those buffers wait for them, as for a first use.)
    // A refusal learnt meanwhile (explain(), an earlier stall) stays, and
    // the loop below acts on it at once.
    for (auto p = posted_.begin(); p != suspects_end; ++p) {
      const Status* known = answer_about(remote_of(*p));
      if (known != nullptr && known->ok()) validated_.erase(remote_of(*p).id());
    }
    stall_asked_ = true;
  }
  bool all_answered = true;
  for (auto p = posted_.begin(); p != suspects_end; ++p) {
    const RemoteBuffer& remote = remote_of(*p);
    const Status* answer = answer_about(remote);
    if (answer == nullptr) {
      // Not answered yet: asked now, unless the question is out already
      // (ask() sends none twice; an answer about this id with another
      // token or size, which answer_about() does not take, asks again).
      Status asked = ask(remote);
      if (!asked.ok()) {
        reset(0, Unavailable("cannot ask the owner about buffer " + std::to_string(remote.id()) +
                             ": " + asked.message()));
        return;
      }
      all_answered = false;
    } else if (!answer->ok()) {
      Status refused = answer->code() == StatusCode::kNotFound
                           ? NotFound("the owner released this buffer while the op was in flight")
                           : *answer;
      validated_[remote.id()] = Validated{HandleClaim::of(remote), refused, 0};  // no more asking
      reset(p->wr_id, refused);
      return;
    }
  }
  if (!all_answered) return;  // (read_answers() gives the owner kAnswerLimit)
  // All still there: slow requests, not stuck ones. Watched afresh.
  watched_since_ = now;
  stall_asked_ = false;
}

bool Connection::cancel_if_needed() {
  for (const auto& [t, n] : touching_) {
    if (t->cancelled()) {
      reset(0, Cancelled("a transfer on this queue pair was cancelled"));
      return true;
    }
  }
  return false;
}

void Connection::reset(uint64_t failed, Status cause, ibv_wc_status failed_wc) {
  // The failed request's op fails as a whole: its other chunks are neither
  // posted again nor left waiting. Found before the drain below, which may
  // complete that very request (a stall seen just as it finished).
  std::shared_ptr<TransferState> failed_transfer;
  uint32_t failed_op = 0;
  for (const Posted& p : posted_) {
    if (p.wr_id != failed) continue;
    failed_transfer = p.chunk.transfer;
    failed_op = p.chunk.op;
  }
  // Error first: from here the NIC only flushes. The last posted request
  // is always signalled and completions come in order, so its completion
  // means nothing posted can touch memory any more.
  if (qp_) {
    qp_->to_error().ignore();
    const uint64_t last = posted_.empty() ? 0 : posted_.back().wr_id;
    // A failed queue gives no completions: nothing to wait for.
    const auto give_up = queue_failed_ ? Clock::now() : Clock::now() + kDrainLimit;
    for (;;) {
      // Taken earlier and not yet looked at, or polled now.
      std::vector<ibv_wc> wc;
      wc.swap(arrived_);
      for (const ibv_wc& c : wc) {
        completed_through_ = std::max(completed_through_, c.wr_id);
        if (c.status != IBV_WC_SUCCESS) continue;
        // Finished before the error took hold: done, not to be repeated.
        while (!posted_.empty() && posted_.front().wr_id <= c.wr_id) {
          finish_posted(posted_.front(), Status::Ok());
          posted_.pop_front();
        }
      }
      if (completed_through_ >= last || Clock::now() >= give_up) break;
      if (wc.empty()) sleep_for(std::chrono::microseconds(50));
      completions_->poll(this);
    }
    if (completed_through_ < last) {
      RDMABUF_LOG_WARN("ibverbs: a queue pair did not drain in time; destroying it");
    }
    completions_->detach(qp_->qp()->qp_num);
    arrived_.clear();
    queue_failed_ = false;
    qp_.reset();  // destroying it also stops the NIC from using it
  }
  for (Posted& p : posted_) {
    if (p.wr_id == failed && failed_wc != IBV_WC_SUCCESS) cause = explain(failed_wc, p.chunk);
  }
  if (failed_transfer) RDMABUF_LOG_INFO("ibverbs: work request failed: " + cause.to_string());
  close_control();
  // The keys were granted to this pair alone; refusals stay true.
  std::erase_if(validated_, [](const auto& entry) { return !is_refusal(entry.second.answer); });
  asked_.clear();
  answer_have_ = 0;
  watched_wr_ = 0;
  stall_asked_ = false;
  // The ops that fail here, each as a whole: the failed request's, with the
  // cause; one whose notice was posted and had not completed (it may have
  // reached the owner, and its bytes must not land again after it); and
  // one with a request flushed for the second time by a failure nobody can
  // be blamed for. The others go again, in order, on a new pair: always
  // after a request that failed for a reason of its own or another
  // transfer's cancellation, once for a failure nobody can be blamed for.
  // Cancelled transfers complete as cancelled.
  const bool for_cancellation = cause.code() == StatusCode::kCancelled;
  const bool blamed = failed_transfer != nullptr;
  struct FailedOp {
    const TransferState* transfer;
    uint32_t op;
    Status why;
  };
  std::vector<FailedOp> failed_ops;
  if (blamed) failed_ops.push_back({failed_transfer.get(), failed_op, cause});
  auto why_failed = [&](const Chunk& c) -> const Status* {
    for (const FailedOp& f : failed_ops) {
      if (f.transfer == c.transfer.get() && f.op == c.op) return &f.why;
    }
    return nullptr;
  };
  for (const Posted& p : posted_) {
    if (p.chunk.transfer->cancelled() || why_failed(p.chunk)) continue;
    if (p.chunk.notice) {
      failed_ops.push_back(
          {p.chunk.transfer.get(), p.chunk.op,
           Unavailable("the queue pair failed (" + cause.message() +
                       ") with the write's notice in flight: the bytes may have landed, and "
                       "the owner may have been told")});
    } else if (!for_cancellation && !blamed && p.chunk.retries > 0) {
      failed_ops.push_back({p.chunk.transfer.get(), p.chunk.op,
                            Status(cause.code(), "queue pair failed: " + cause.message())});
    }
  }
  std::deque<Chunk> again;
  for (Posted& p : posted_) {
    if (const Status* why = why_failed(p.chunk)) {
      finish_posted(p, *why);
    } else if (p.chunk.transfer->cancelled()) {
      finish_posted(p, Cancelled("cancelled"));
    } else {
      if (!for_cancellation && !blamed) p.chunk.retries++;
      untouch(p.chunk.transfer.get());
      p.region.reset();
      again.push_back(std::move(p.chunk));
    }
  }
  posted_.clear();
  // Chunks waiting for an answer ask again on the next pair.
  for (auto& [id, chunks] : parked_) {
    for (Chunk& c : chunks)
      again.push_back(std::move(c));
  }
  parked_.clear();
  for (auto it = again.rbegin(); it != again.rend(); ++it)
    pending_.push_front(std::move(*it));
  if (!failed_ops.empty()) {  // their chunks not yet posted fail with them
    std::deque<Chunk> kept;
    for (Chunk& c : pending_) {
      if (const Status* why = why_failed(c)) {
        complete(c, *why);
      } else {
        kept.push_back(std::move(c));
      }
    }
    pending_.swap(kept);
  }
}

}  // namespace rdmabuf::ibverbs
