// An endpoint's receives (receive_table.h has their records): posting one
// sends the peer a credit, held back to go with the next frame (credits.h);
// waiting reads the channel until the peer's answer came (progress.cc); a
// receive that times out is withdrawn, and its memory is not the peer's
// once the wait returns.
#include "common/cuda_driver.h"
#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {
namespace {

// How long a withdrawn receive waits for the sender's answer before the
// endpoint is closed (then nobody can tell whether the message landed).
constexpr auto kWithdrawGrace = std::chrono::seconds(5);

}  // namespace

Result<uint64_t> EndpointImpl::post_receive(const LocalMemory& into) {
  // A receive that only inline messages fit needs no registration; a larger
  // one registers now only while the messages lately were too large for a
  // frame (else when the sender asks: kHandleWanted).
  if (into.size() > endpoint::kInlineLimit && receives_.register_when_posted()) [[unlikely]] {
    RDMABUF_RETURN_IF_ERROR(usable());
    LocalMemory bounce;
    RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer handle, register_receive(into, bounce));
    const std::vector<uint8_t> handle_bytes = handle.to_bytes();
    return post_receive(into, std::move(handle), handle_bytes, bounce);
  }
  return post_receive(into, RemoteBuffer(), {}, LocalMemory());
}

Result<RemoteBuffer> EndpointImpl::register_receive(const LocalMemory& into, LocalMemory& bounce) {
  auto registered = host_.register_buffer(into);
  if (registered.ok() || !into.on_gpu()) return registered;
  // GPU memory that this manager's transports cannot reach (an RDMA NIC
  // without dma-buf or peer memory, and no other transport): the message
  // lands in host memory, then goes to the GPU.
  RDMABUF_ASSIGN_OR_RETURN(bounce, LocalMemory::allocate(into.size()));
  return host_.register_buffer(bounce);
}

// post_receive() of `into`, with its `handle` (and the handle's bytes) when
// it was registered, else an empty one.
[[gnu::always_inline]] inline Result<uint64_t> EndpointImpl::post_receive(
    const LocalMemory& into, RemoteBuffer handle, std::span<const uint8_t> handle_bytes,
    const LocalMemory& bounce) {
  uint64_t seq;
  bool full = false;
  const bool frames_lock_is_state_lock = !channel_.writes_may_wait();
  {
    StateLock lock(mu_);
    if (!broken_.ok()) {
      Status why = broken_;
      lock.unlock();
      if (handle.valid()) host_.release(handle).ignore();
      return why;
    }
    seq = receives_.add(lock, into, std::move(handle), bounce);
    // With the next frame, or by a wait (see hold_credit).
    if (frames_lock_is_state_lock) full = hold_credit(seq, into.size(), handle_bytes);
  }
  if (!frames_lock_is_state_lock) {
    std::lock_guard lock(write_mu_);
    full = hold_credit(seq, into.size(), handle_bytes);
  }
  if (full) {
    flush().ignore();  // a failure breaks the endpoint: its waits say so
  } else if (serve_sleeping_.load()) {
    signal_eventfd(wake_.get());
  }
  return seq;
}

Result<uint64_t> EndpointImpl::wait_receive(uint64_t seq, std::chrono::milliseconds timeout) {
  WaitDeadline deadline(timeout);
  // Credits held back go now, even when the message is here already, once
  // they are due: a receiver that keeps up with a fast sender would
  // otherwise hold them until it falls behind, and the sender would stall
  // meanwhile. Fewer wait for the next frame: one send then carries several.
  if (credits_.due()) {
    flush().ignore();  // a failure breaks the endpoint: the wait says so
  }
  StateLock lock(mu_);
  endpoint::Receive* waited = receives_.find(lock, seq);
  if (waited == nullptr || waited->abandoned) {
    return FailedPrecondition("this receive was waited for already");
  }
  endpoint::Receive& receive = *waited;  // stays put; only this call erases it
  auto answered = [&] { return receive.answered || !broken_.ok(); };
  if (!await(lock, deadline, answered)) {
    // Withdraw: no byte may land once we return. Release first (it waits
    // for a write in flight), then ask the sender what became of it.
    receive.withdrawn = true;  // a handle registered from now on is released
    const RemoteBuffer handle = receive.handle;
    lock.unlock();
    if (handle.valid()) host_.release(handle).ignore();
    Status withdrawn = write_frame(endpoint::answer_frame(Frame::kWithdrawn, seq, 0));
    lock.lock();
    WaitDeadline grace(kWithdrawGrace);
    if (withdrawn.ok() && !await(lock, grace, answered)) {
      lock.unlock();
      break_with(DeadlineExceeded("the peer did not answer a withdrawn receive"));
      lock.lock();
    }
  }
  Status status = std::move(receive.status);
  if (!receive.answered) {
    status = broken_;
    if (status.ok()) status = DeadlineExceeded("no message came in time");
  }
  const uint64_t size = receive.size;
  const RemoteBuffer handle = std::move(receive.handle);
  const LocalMemory into = receive.into;
  const LocalMemory bounce = receive.written ? std::move(receive.bounce) : LocalMemory();
  receives_.erase(lock, seq);
  lock.unlock();
  if (handle.valid()) host_.release(handle).ignore();  // NotFound when withdrawn
  if (!status.ok()) return status;
  // Written into the bounce memory: now to the GPU (frames went there direct).
  if (bounce.data() && size > 0) {
    RDMABUF_RETURN_IF_ERROR(cuda::copy_into(into, 0, bounce.data(), size));
  }
  return size;
}

void EndpointImpl::abandon_receive(uint64_t seq) {
  RemoteBuffer handle;
  bool withdraw = false;
  {
    StateLock lock(mu_);
    endpoint::Receive* receive = receives_.find(lock, seq);
    if (receive == nullptr || receive->abandoned) return;
    handle = receive->handle;
    withdraw = !receive->answered && broken_.ok();
    if (withdraw) {
      receive->abandoned = true;  // its answer is dropped when it comes
    } else {
      receives_.erase(lock, seq);
    }
  }
  if (handle.valid()) host_.release(handle).ignore();
  if (withdraw) write_frame(endpoint::answer_frame(Frame::kWithdrawn, seq, 0)).ignore();
}

// The peer has a message for receive `seq` that needs its memory: registers
// it, unless the receive is no longer open for the message.
Status EndpointImpl::answer_handle_request(uint64_t id, uint64_t seq) {
  auto refuse = [&](const Status& why) { return reply(Frame::kReceiveHandle, id, why, 0, {}); };
  const Status gone = NotFound("the receive was withdrawn");
  LocalMemory into;
  RemoteBuffer handle;
  bool open = false;
  {
    // Never reply with mu_ held: a failed write breaks the endpoint, which
    // takes mu_.
    StateLock lock(mu_);
    endpoint::Receive* receive = receives_.open(lock, seq);
    if (receive != nullptr) {
      open = true;
      into = receive->into;
      handle = receive->handle;
    }
  }
  if (!open) return refuse(gone);
  if (into.size() <= endpoint::kInlineLimit) {
    // Only an inline message fits it: a peer that follows the protocol never
    // asks, and its memory is never registered.
    return ProtocolError("the peer asked for the handle of receive " + std::to_string(seq) +
                         ", which only an inline message fits");
  }
  if (!handle.valid()) {
    LocalMemory bounce;
    auto registered = register_receive(into, bounce);
    if (!registered.ok()) return refuse(registered.status());
    handle = std::move(registered).value();
    bool kept = false;
    {
      StateLock lock(mu_);
      endpoint::Receive* receive = receives_.open(lock, seq);
      if (receive != nullptr && !receive->handle.valid()) {
        receive->handle = handle;  // released when the receive ends
        receive->bounce = bounce;
        kept = true;
      }
    }
    if (!kept) {  // withdrawn meanwhile: its memory is not the peer's
      host_.release(handle).ignore();
      return refuse(gone);
    }
  }
  return reply(Frame::kReceiveHandle, id, Status::Ok(), 0, handle.to_bytes());
}

}  // namespace rdmabuf
