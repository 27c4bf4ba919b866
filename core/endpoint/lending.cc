// Memory lent between the two sides of an endpoint: a borrower asks for a
// buffer (kLendRequest) and gets its handle for a lease (kLent), may renew
// the lease (kRenew, kRenewed), and hands the buffer back by passing its
// handle (kBuffer), after which the lender takes the memory, with what the
// borrower wrote, from receive_local_buffer(). The lease keeper, a thread
// of each endpoint, releases lent memory whose lease ended: from then on
// the borrower's handle is NotFound. Loans count against the manager's
// LendBudget (RDMABUF_LEND_LIMIT); leases are capped at Config::max_lease.
#include <pthread.h>

#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {
namespace {

// Handles passed (kBuffer) and not yet taken by receive_buffer: beyond this
// the peer is flooding us and the endpoint is closed.
constexpr size_t kMaxQueuedBuffers = 4096;

}  // namespace

Result<Lease> EndpointImpl::request_remote_buffer(uint64_t size, std::chrono::milliseconds lease,
                                                  std::chrono::milliseconds timeout) {
  if (size == 0) return InvalidArgument("cannot lend 0 bytes");
  if (lease.count() <= 0) return InvalidArgument("a lease must be > 0 ms");
  RDMABUF_ASSIGN_OR_RETURN(
      AwaitedReply reply,
      call(Frame::kLendRequest, {0, size, static_cast<uint64_t>(lease.count())}, timeout));
  RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer buffer, RemoteBuffer::from_bytes(reply.body));
  if (buffer.owner().manager_id != peer_manager_id_ || buffer.size() != size) {
    return ProtocolError("the peer lent a buffer that is not its own or not the size asked");
  }
  return Lease{std::move(buffer), std::chrono::milliseconds(reply.value)};
}

Result<std::chrono::milliseconds> EndpointImpl::renew(const RemoteBuffer& lent,
                                                      std::chrono::milliseconds lease,
                                                      std::chrono::milliseconds timeout) {
  if (!lent.valid() || lent.owner().manager_id != peer_manager_id_) {
    return InvalidArgument("only a buffer the peer lent can be renewed");
  }
  if (lease.count() <= 0) return InvalidArgument("a lease must be > 0 ms");
  RDMABUF_ASSIGN_OR_RETURN(
      AwaitedReply reply,
      call(Frame::kRenew, {0, lent.id(), static_cast<uint64_t>(lease.count())}, timeout));
  return std::chrono::milliseconds(reply.value);
}

Result<LocalMemory> EndpointImpl::receive_local_buffer(std::chrono::milliseconds timeout) {
  return take_next(returned_, timeout, "no lent buffer came back in time");
}

Status EndpointImpl::answer_lend(uint64_t id, uint64_t size, std::chrono::milliseconds lease) {
  auto refuse = [&](const Status& why) { return reply(Frame::kLent, id, why, 0, {}); };
  if (size == 0 || lease.count() == 0) return refuse(InvalidArgument("nothing to lend"));
  LendBudget& budget = host_.lend_budget();
  if (!budget.take(size)) {
    return refuse(ResourceExhausted("lending " + std::to_string(size) +
                                    " bytes more would pass this manager's lend limit of " +
                                    std::to_string(budget.limit()) + " (RDMABUF_LEND_LIMIT)"));
  }
  const int device = host_.config().lend_device;
  auto memory = device < 0 ? LocalMemory::allocate(size) : LocalMemory::allocate_gpu(size, device);
  auto handle = memory.ok() ? host_.register_buffer(*memory) : memory.status();
  if (!handle.ok()) {
    budget.give_back(size);
    return refuse(handle.status());
  }
  lease = std::min(lease, host_.config().max_lease);
  Status broken;
  {
    StateLock lock(mu_);
    // Once broken, the lease keeper has reclaimed every loan and stopped: a
    // loan added now would never be reclaimed.
    broken = broken_;
    if (broken.ok()) lent_[handle->id()] = Lent{*memory, *handle, Clock::now() + lease};
  }
  if (!broken.ok()) {
    host_.release(*handle).ignore();
    budget.give_back(size);
    return broken;
  }
  leases_cv_.notify_all();  // the lease keeper learns the new expiry
  {
    // The first loan starts it: an endpoint that lends nothing has none.
    std::lock_guard threads(threads_mu_);
    if (!joined_ && !lease_keeper_.joinable()) {
      lease_keeper_ = std::thread([this] { keep_leases(); });
      pthread_setname_np(lease_keeper_.native_handle(), "rdmabuf-leases");
    }
  }
  return reply(Frame::kLent, id, Status::Ok(), static_cast<uint64_t>(lease.count()),
               handle->to_bytes());
}

Status EndpointImpl::answer_renew(uint64_t id, uint64_t buffer_id,
                                  std::chrono::milliseconds lease) {
  lease = std::min(lease, host_.config().max_lease);
  Status st = Status::Ok();
  {
    StateLock lock(mu_);
    auto it = lent_.find(buffer_id);
    if (it == lent_.end()) {
      st = NotFound("the lease has ended");
    } else {
      it->second.expires = Clock::now() + lease;  // later: the keeper finds out when it wakes
    }
  }
  return reply(Frame::kRenewed, id, st, st.ok() ? static_cast<uint64_t>(lease.count()) : 0, {});
}

// A handle from the peer (kBuffer): memory we lent coming back, or any other
// handle, queued for receive_buffer().
Status EndpointImpl::take_buffer(RemoteBuffer buffer) {
  StateLock lock(mu_);
  auto lent = buffer.owner().manager_id == host_.identity().manager_id ? lent_.find(buffer.id())
                                                                       : lent_.end();
  if (lent == lent_.end()) {
    if (remote_buffers_.size() >= kMaxQueuedBuffers) {
      return ResourceExhausted("the peer passed more than " + std::to_string(kMaxQueuedBuffers) +
                               " handles nobody took");
    }
    remote_buffers_.push_back(std::move(buffer));
    wake_sleepers(lock);
    return Status::Ok();
  }
  Lent back = std::move(lent->second);
  lent_.erase(lent);
  lock.unlock();
  // The lease ends: the peer's access stops before we hand the memory on.
  host_.release(back.handle).ignore();
  host_.lend_budget().give_back(back.memory.size());
  auto range = back.memory.slice(buffer.offset(), buffer.size());
  lock.lock();
  returned_.push_back(range.ok() ? *range : back.memory);
  wake_sleepers(lock);
  return Status::Ok();
}

// The lease keeper: reclaims lent memory whose lease ended, and all of it
// once the endpoint broke.
void EndpointImpl::keep_leases() {
  StateLock lock(mu_);
  while (true) {
    Deadline next = Deadline::max();
    std::vector<Lent> expired;
    const Deadline now = Clock::now();
    for (auto it = lent_.begin(); it != lent_.end();) {
      if (it->second.expires <= now || !broken_.ok()) {
        expired.push_back(std::move(it->second));
        it = lent_.erase(it);
      } else {
        next = std::min(next, it->second.expires);
        ++it;
      }
    }
    if (!expired.empty()) {
      lock.unlock();
      for (Lent& l : expired) {
        host_.release(l.handle).ignore();  // from now on: kNotFound
        host_.lend_budget().give_back(l.memory.size());
      }
      lock.lock();
      continue;
    }
    if (!broken_.ok()) return;
    if (next == Deadline::max()) {
      leases_cv_.wait(lock);
    } else {
      leases_cv_.wait_until(lock, next);
    }
  }
}

}  // namespace rdmabuf
