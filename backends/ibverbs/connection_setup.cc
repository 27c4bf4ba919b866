// How a Connection sets its queue pair up with the owner: the handshake on
// one of the backend's handshakers, and what becomes of the chunks waiting when it fails
// (connection.h).
#include <algorithm>
#include <utility>

#include "backends/ibverbs/connection.h"
#include "backends/ibverbs/handshake.h"
#include "common/hello.h"
#include "common/log.h"

namespace rdmabuf::ibverbs {
namespace {

// How long a handshake may take.
constexpr auto kConnectBudget = std::chrono::seconds(10);
constexpr auto kMaxBackoff = std::chrono::milliseconds(5000);

}  // namespace

void Connection::begin_handshake() {
  Status backing_off = health();
  if (!backing_off.ok()) {
    hand_on_pending(backing_off);
    return;
  }
  auto room = completions_->reserve();
  if (!room.ok()) {
    Status failure(room.status().code(), "cannot set up a queue pair to device " +
                                             context_.owner_device + " of the owner at " +
                                             context_.owner_address.to_string() + ": " +
                                             room.status().message());
    hand_on_pending(failure);
    return;
  }
  // The handle the first op waiting names: the owner sets up a pair only for
  // a reader that holds one of its handles.
  const RemoteBuffer& presented = pending_.front().transfer->op(pending_.front().op).remote;
  auto handshake = std::make_shared<Handshake>();
  handshake->claim = HandleClaim::of(presented);
  // (std::function copies what it holds; the room moves once, into the job.)
  auto job_room = std::make_shared<CqRoom>(std::move(room).value());
  {
    std::lock_guard lock(handshaker_mu_);
    // stop() waits for every handshake begun before it stopped inbox_.
    if (inbox_.stopped()) return;  // the run it kicked fails what waits
    const bool started = context_.handshakers->run(
        [context = context_, handshake, job_room, self = weak_from_this(), loop = &loop_] {
          shake_hands(context, handshake->claim, std::move(*job_room), handshake, self, loop);
        });
    if (started) {
      handshake_ = handshake;
      shaking_ = std::move(handshake);
      return;
    }
  }
  hand_on_pending(ResourceExhausted("no thread to set up a queue pair with the owner at " +
                                    context_.owner_address.to_string() + " (out of threads)"));
}

void Connection::shake_hands(ConnectionContext context, HandleClaim claim, CqRoom room,
                             std::shared_ptr<Handshake> into, std::weak_ptr<Connection> self,
                             EventLoop* loop) {
  // A budget of its own, not the ops' deadlines: the pair serves the ops
  // that come later too, and a handshake cut short by an impatient op would
  // count as a failure (and back off).
  const Deadline deadline = Clock::now() + kConnectBudget;
  bool claim_refused = false;
  std::unique_ptr<QueuePair> pair;
  Fd control;
  auto attempt = [&]() -> Status {
    QueuePair::Shape shape{kPairDepth};
    shape.inline_bytes = kNoticeBytes;  // a notice goes in its work request where the NIC allows
    shape.send_sge = gather_limit(*context.device);
    RDMABUF_ASSIGN_OR_RETURN(auto qp, QueuePair::create(*context.device, shape, std::move(room),
                                                        QueuePair::Shared::kSends));
    RDMABUF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(context.owner_address, deadline, context.stop_fd));
    Hello hello{Channel::kIbverbs, context.self_id, context.owner_id};
    RDMABUF_RETURN_IF_ERROR(exchange_hello(fd.get(), hello, deadline, context.stop_fd).status());
    RDMABUF_RETURN_IF_ERROR(send_connect(fd.get(), context.owner_device, qp->local(), claim,
                                         deadline, context.stop_fd));
    auto accepted = read_accepted(fd.get(), deadline, context.stop_fd);
    if (!accepted.ok()) {
      claim_refused = refuses_claim(accepted.status().code());
      return accepted.status();
    }
    RDMABUF_RETURN_IF_ERROR(qp->connect(*accepted));
    pair = std::move(qp);
    control = std::move(fd);
    return Status::Ok();
  };
  Status status = attempt();
  {
    std::lock_guard lock(into->mu);
    into->done = true;
    into->status = std::move(status);
    into->claim_refused = claim_refused;
    into->qp = std::move(pair);
    into->control = std::move(control);
  }
  std::shared_ptr<Connection> connection = self.lock();
  if (connection) loop->kick(connection);
  {
    std::lock_guard lock(into->mu);
    into->ended = true;
  }
  into->ended_cv.notify_all();
  // `connection` goes last: when it is the last reference, ~Connection
  // runs here and finds this job ended.
}

bool Connection::finish_handshake() {
  {
    std::lock_guard lock(handshake_->mu);
    if (!handshake_->done) return false;
  }
  wait_for_handshaker();  // it has nothing left to do
  std::shared_ptr<Handshake> done = std::move(handshake_);
  const std::string where = context_.owner_address.to_string();
  Status st = done->status;
  if (!st.ok() && context_.stopping->load(std::memory_order_acquire)) {
    fail_pending(Cancelled("the manager is shutting down"));
    return true;
  }
  if (done->claim_refused) {
    // The handle is at fault, not the owner: its ops fail (and later ones
    // at once), the others try again with a handle of their own.
    const HandleClaim claim = done->claim;
    Status refused(st.code(), "the owner refused the handle: " + st.message());
    validated_[claim.id] = Validated{claim, refused, 0};
    std::deque<Chunk> kept;
    for (Chunk& c : pending_) {
      if (HandleClaim::of(c.transfer->op(c.op).remote) == claim) {
        complete(c, refused);
      } else {
        kept.push_back(std::move(c));
      }
    }
    pending_.swap(kept);
    return true;
  }
  if (st.ok()) {
    qp_ = std::move(done->qp);
    control_ = std::move(done->control);
    generation_ = completions_->new_generation();
    next_wr_ = (generation_ << kGenerationShift) | 1;
    completed_through_ = next_wr_ - 1;
    completions_->attach(qp_->qp()->qp_num, this);
    std::lock_guard lock(health_mu_);
    failure_ = Status::Ok();
    backoff_ = std::chrono::milliseconds(100);
    RDMABUF_LOG_DEBUG("ibverbs: queue pair to " + context_.owner_device + " at " + where +
                      " ready");
    return true;
  }
  Status failure(st.code(), "cannot set up a queue pair to device " + context_.owner_device +
                                " of the owner at " + where + ": " + st.message());
  {
    std::lock_guard lock(health_mu_);
    failure_ = failure;
    retry_at_ = Clock::now() + backoff_;
    backoff_ =
        std::min(backoff_ * 2, std::chrono::duration_cast<std::chrono::milliseconds>(kMaxBackoff));
  }
  RDMABUF_LOG_INFO("ibverbs: " + failure.message());
  hand_on_pending(failure);
  return true;
}

void Connection::hand_on_pending(const Status& failure) {
  // Whole ops only: every chunk of an op that has none reported is here
  // (an op's chunks are enqueued together, and without a queue pair none
  // is posted or parked).
  std::vector<std::pair<std::shared_ptr<TransferState>, std::vector<uint32_t>>> handed;
  for (Chunk& c : pending_) {
    TransferState* t = c.transfer.get();
    if (!context_.router || t->cancelled() || !t->no_part_reported(c.op)) {
      complete(c, failure);
      continue;
    }
    auto group = std::find_if(handed.begin(), handed.end(),
                              [t](const auto& g) { return g.first.get() == t; });
    if (group == handed.end()) group = handed.insert(handed.end(), {c.transfer, {}});
    if (std::find(group->second.begin(), group->second.end(), c.op) == group->second.end())
      group->second.push_back(c.op);
    c.transfer.reset();  // given up: the next backend reports the op
  }
  pending_.clear();
  for (auto& [transfer, ops] : handed)
    context_.router->reroute(transfer, ops, "ibverbs", failure);
}

}  // namespace rdmabuf::ibverbs
