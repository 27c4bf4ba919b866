// An endpoint's sends (send_queue.h has their stages).
//
// Posted sends take the peer's credits in the order they were posted. A
// matched send that frames answer (an inline message, one in parts, or
// kTooLarge) is done once they are written. A larger message asks for the
// receive's handle when its credit came without one, then is a one-sided
// write submitted without waiting, then a kSent frame. Whoever comes by
// moves posted sends on (progress_sends): a caller posting or waiting, a
// caller reading the channel, or the endpoint's server, woken by a write
// that finished. Each step is claimed under the state lock (kBusy), so any
// number of threads may do so at once.
#include <algorithm>
#include <array>

#include "common/cuda_driver.h"
#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {

using endpoint::Outgoing;
using endpoint::SendQueue;
using endpoint::Stage;

Status EndpointImpl::post_send(const LocalMemory& message, std::chrono::milliseconds write_timeout,
                               uint64_t& id) {
  id = SendQueue::kRefused;
  if (message.on_gpu() && message.size() <= channel_.stream_limit()) {
    // Frames carry it (the channel reads it with the CPU): its bytes come
    // to host memory first. A larger one goes by one-sided write, which
    // takes GPU memory itself.
    RDMABUF_ASSIGN_OR_RETURN(LocalMemory host, cuda::host_copy(message));
    return post_send(host, write_timeout, id);
  }
  {
    StateLock lock(mu_);
    RDMABUF_RETURN_IF_ERROR(broken_);
    id = SendQueue::kAnswered;
    auto& credits = credits_.peer(lock);
    if (sends_.queued(lock).empty() && !credits.empty() && answered_by_frames(lock, message)) {
      Credit credit = credits.take_front();
      if (!channel_.writes_may_wait() &&
          message.size() <= std::min(endpoint::kInlineLimit, credit.capacity)) {
        // Into the channel under this hold of the state lock (its frames
        // lock), when it has room now: a small send takes one lock.
        const endpoint::InlineHead head = endpoint::inline_head(credit.seq, message.size());
        const std::span<const uint8_t> pieces[] = {
            head, {reinterpret_cast<const uint8_t*>(message.data()), message.size()}};
        bool doorbell = false;
        Result<bool> wrote = try_write(lock, pieces, doorbell);
        if (!wrote.ok() || *wrote) {
          lock.unlock();
          if (doorbell) channel_.ring_doorbell();
          return wrote.ok() ? Status::Ok() : broke_while_sending(wrote.status());
        }
      }
      lock.unlock();
      return send_in_frames(credit, message);
    }
    id = sends_.add(lock, message, write_timeout);
  }
  progress_sends();
  return Status::Ok();
}

Status EndpointImpl::wait_send(uint64_t id, std::chrono::milliseconds timeout) {
  WaitDeadline deadline(timeout);
  StateLock lock(mu_);
  Outgoing* found = sends_.find(lock, id);
  if (found == nullptr) return FailedPrecondition("this send was waited for already");
  Outgoing& out = *found;  // stays put; only this call erases it
  while (out.stage != Stage::kDone) {
    if (!broken_.ok() || Clock::now() >= deadline.get()) {
      cut_short(lock, id, out);  // (progress_sends does nothing once broken)
      continue;
    }
    if (send_work_ready(lock)) {
      lock.unlock();
      progress_sends();
      lock.lock();
      continue;
    }
    await(lock, deadline,
          [&] { return out.stage == Stage::kDone || !broken_.ok() || send_work_ready(lock); });
  }
  Status status = std::move(out.status);
  sends_.erase(lock, id);
  return status;
}

// Whether the frames the sender writes answer the oldest credit with
// `message`: no one-sided write (see send_in_frames).
bool EndpointImpl::answered_by_frames(const StateLock& lock, const LocalMemory& message) {
  return answered_by_frames(message, credits_.peer(lock).front());
}

// Something for progress_sends() to do.
bool EndpointImpl::send_work_ready(const StateLock& lock) {
  return (!sends_.queued(lock).empty() && !credits_.peer(lock).empty()) || sends_.has_events(lock);
}

// Answers `credit` with frames: kTooLarge when `message` does not fit; else
// the message itself, in one kSentInline frame when small, or in kSentPart
// frames cut and written as the channel's parts() say.
Status EndpointImpl::send_in_frames(const Credit& credit, const LocalMemory& message) {
  const uint64_t size = message.size();
  if (size > credit.capacity) {
    RDMABUF_RETURN_IF_ERROR(
        write_frame(endpoint::answer_frame(Frame::kTooLarge, credit.seq, size)));
    return InvalidArgument("a message of " + std::to_string(size) +
                           " bytes does not fit the receive the peer posted (" +
                           std::to_string(credit.capacity) + " bytes)");
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(message.data());
  if (size <= endpoint::kInlineLimit) {
    const endpoint::InlineHead head = endpoint::inline_head(credit.seq, size);
    const std::span<const uint8_t> pieces[] = {head, {bytes, size}};
    return write_pieces(pieces);
  }
  const endpoint::PartShape& parts = channel_.parts();
  std::vector<endpoint::PartHead> heads(parts.parts_per_write);
  std::vector<std::span<const uint8_t>> pieces;
  for (uint64_t at = 0; at < size;) {
    pieces.clear();
    for (int i = 0; i < parts.parts_per_write && at < size; ++i) {
      const uint64_t n = std::min(parts.part_bytes, size - at);
      heads[i] = endpoint::part_head(credit.seq, size, n);
      pieces.emplace_back(heads[i]);
      pieces.emplace_back(bytes + at, n);
      at += n;
    }
    RDMABUF_RETURN_IF_ERROR(write_pieces(pieces));
  }
  return Status::Ok();
}

// Moves posted sends on as far as they go without waiting for the peer:
// matches queued sends with credits, and takes up the handles that came
// and the writes that finished. No lock held; blocks only to write frames.
void EndpointImpl::progress_sends() {
  StateLock lock(mu_);
  while (broken_.ok()) {  // once broken, each wait ends its own send
    auto& queued = sends_.queued(lock);
    auto& credits = credits_.peer(lock);
    if (!queued.empty() && !credits.empty()) {
      if (send_queued_inline(lock)) continue;
      const uint64_t id = queued.front();
      queued.pop_front();
      Outgoing& out = *sends_.find(lock, id);  // queued: its wait has not ended
      out.credit = credits.take_front();
      if (answered_by_frames(out.message, out.credit)) {
        SendQueue::move(out, Stage::kBusy);
        lock.unlock();
        Status sent = send_in_frames(out.credit, out.message);
        lock.lock();
        finish(lock, out, std::move(sent));
        continue;
      }
      sends_.take_credit(lock, out.credit.seq);  // taken, not withdrawn
      if (out.credit.buffer.valid()) {
        start_write(lock, id, out);
      } else {
        ask_for_handle(lock, id, out);
      }
      continue;
    }
    auto& events = sends_.events(lock);
    if (events.empty()) return;
    const uint64_t id = events.front();
    events.pop_front();
    Outgoing* found = sends_.find(lock, id);
    if (found == nullptr) continue;
    Outgoing& out = *found;
    if (out.stage == Stage::kAskingHandle) {
      take_handle(lock, id, out);
    } else if (out.stage == Stage::kWriting && out.write_done) {
      SendQueue::move(out, Stage::kBusy);
      Transfer write = std::move(out.write);
      lock.unlock();
      Status wrote = write.status();
      write = Transfer();  // its on_done has run: this does not wait
      conclude_write(lock, id, out, std::move(wrote), /*may_retry=*/true);
    }
  }
}

// Sends the queued messages at the front that go inline, as far as the
// credits here reach, up to kMostGathered of them in one write (lock held;
// let go for the write): over TCP one system call for them all, where a
// stream of small messages made one each. False when the first queued
// message does not go inline (larger than kInlineLimit, or than the oldest
// credit's receive: progress_sends() answers it).
bool EndpointImpl::send_queued_inline(StateLock& lock) {
  constexpr size_t kMostGathered = 16;
  std::array<endpoint::InlineHead, kMostGathered> heads;
  std::array<std::span<const uint8_t>, 2 * kMostGathered> pieces;
  std::array<Outgoing*, kMostGathered> gathered;
  size_t count = 0;
  auto& queued = sends_.queued(lock);
  auto& credits = credits_.peer(lock);
  while (count < kMostGathered && !queued.empty() && !credits.empty()) {
    Outgoing& out = *sends_.find(lock, queued.front());  // queued: its wait has not ended
    const uint64_t size = out.message.size();
    if (size > endpoint::kInlineLimit || size > credits.front().capacity) break;
    queued.pop_front();
    out.credit = credits.take_front();
    SendQueue::move(out, Stage::kBusy);
    heads[count] = endpoint::inline_head(out.credit.seq, size);
    pieces[2 * count] = heads[count];
    pieces[2 * count + 1] = {reinterpret_cast<const uint8_t*>(out.message.data()), size};
    gathered[count++] = &out;
  }
  if (count == 0) return false;
  lock.unlock();
  Status sent = write_pieces(std::span(pieces.data(), 2 * count));
  lock.lock();
  for (size_t i = 0; i < count; ++i)
    SendQueue::finish(*gathered[i], sent);
  announce_done(lock);
  return true;
}

// The receiver registers its memory only now that a message needs it: asks
// for the handle of `out`'s receive (kAskingHandle after).
void EndpointImpl::ask_for_handle(StateLock& lock, uint64_t id, Outgoing& out) {
  SendQueue::move(out, Stage::kBusy);
  out.request = next_request_++;
  AwaitedReply& slot = replies_[out.request];
  slot.for_send = true;
  slot.send = id;
  const uint64_t seq = out.credit.seq;
  const uint64_t request = out.request;
  lock.unlock();
  // A failure breaks the endpoint: the send's wait says so.
  write_frame(endpoint::request_frame(Frame::kHandleWanted, {request, seq, 0})).ignore();
  lock.lock();
  SendQueue::move(out, Stage::kAskingHandle);
  // Its event, when the reply came meanwhile, may have been taken (and
  // dropped) while the send was kBusy.
  if (replies_.count(request) != 0 && replies_[request].arrived) {
    sends_.events(lock).push_back(id);
  }
  wake_sleepers(lock);
}

// The answer to `out`'s handle request came.
void EndpointImpl::take_handle(StateLock& lock, uint64_t id, Outgoing& out) {
  auto it = replies_.find(out.request);
  if (it == replies_.end() || !it->second.arrived) return;
  AwaitedReply reply = std::move(it->second);
  replies_.erase(it);
  Status st = reply.status;
  if (st.ok()) {
    auto buffer = RemoteBuffer::from_bytes(reply.body);
    if (!buffer.ok()) {
      st = buffer.status();
    } else if (buffer->owner().manager_id != peer_manager_id_) {
      st = ProtocolError("the peer sent a receive's handle that is not its own");
    } else {
      out.credit.buffer = std::move(buffer).value();
    }
  }
  if (st.ok()) {
    start_write(lock, id, out);
    return;
  }
  SendQueue::move(out, Stage::kBusy);
  lock.unlock();
  conclude_write(lock, id, out, std::move(st), /*may_retry=*/true);
}

// Submits `out`'s one-sided write into its receive (kWriting after). The
// write's on_done reports to the queue's events.
void EndpointImpl::start_write(StateLock& lock, uint64_t id, Outgoing& out) {
  SendQueue::move(out, Stage::kBusy);
  out.write_done = false;
  auto target = out.credit.buffer.slice(0, out.message.size());
  if (!target.ok()) {
    lock.unlock();
    conclude_write(lock, id, out, target.status(), /*may_retry=*/false);
    return;
  }
  std::vector<Op> ops;
  ops.push_back(Op::write(std::move(target).value(), out.message));
  const auto timeout = out.write_timeout;
  lock.unlock();
  Transfer write = host_.submit(std::move(ops), timeout, [this, id] { write_finished(id); });
  lock.lock();
  out.write = std::move(write);
  SendQueue::move(out, Stage::kWriting);
  // As in ask_for_handle: a write that finished already may have lost its event.
  if (out.write_done) sends_.events(lock).push_back(id);
  wake_sleepers(lock);  // a wait that wants to cut it short may now
}

// A send's one-sided write finished (its on_done, on a library thread).
void EndpointImpl::write_finished(uint64_t id) {
  bool reading;
  bool serve_waits;
  {
    StateLock lock(mu_);
    Outgoing* out = sends_.find(lock, id);
    if (out == nullptr) return;
    out->write_done = true;
    sends_.events(lock).push_back(id);
    reading = role_.held(lock);
    serve_waits = role_.wanted();
  }
  cv_.notify_all();
  // A caller reading the channel may be asleep on it; so may the endpoint's
  // server. Either moves the send on. With no caller reading, the server is
  // woken even between its looks (up to kMostLinger apart): the peer waits
  // for this send's kSent. Not while it waits for the reading caller to
  // give the role back: that caller moves it on.
  if (reading) signal_eventfd(sends_wake_.get());
  if (!reading || (serve_sleeping_.load() && !serve_waits)) signal_eventfd(wake_.get());
}

// Ends `out`'s use of its credit, after its write (kBusy, claimed by the
// caller; no lock held, and held again on return): a kSent frame when
// `wrote`, else kNotTaken, so that every credit gets its answer. A send
// whose receive was withdrawn meanwhile then goes back to the front of the
// queue, for the next receive, when `may_retry`.
void EndpointImpl::conclude_write(StateLock& lock, uint64_t id, Outgoing& out, Status wrote,
                                  bool may_retry) {
  const uint64_t seq = out.credit.seq;
  lock.lock();
  const bool withdrawn = sends_.give_back_credit(lock, seq);
  lock.unlock();
  if (wrote.ok()) {
    Status sent = write_frame(endpoint::answer_frame(Frame::kSent, seq, out.message.size()));
    lock.lock();
    finish(lock, out, std::move(sent));
    return;
  }
  Status answered = write_frame(endpoint::answer_frame(Frame::kNotTaken, seq, 0));
  // A receive withdrawn meanwhile refuses the write (NotFound: its buffer is
  // released, perhaps before its withdrawal reached us).
  const bool retry =
      answered.ok() && may_retry && (withdrawn || wrote.code() == StatusCode::kNotFound);
  lock.lock();
  if (retry && broken_.ok()) {
    SendQueue::move(out, Stage::kQueued);
    out.credit = Credit{};
    sends_.queued(lock).push_front(id);
    wake_sleepers(lock);
    return;
  }
  finish(
      lock, out,
      answered.ok() ? wrote.with_context("writing the message into the peer's receive") : answered);
}

// `out` is done with `status` (lock held). Its wait may be the reader role's
// holder, asleep on the channel rather than on cv_: woken too.
void EndpointImpl::finish(const StateLock& lock, Outgoing& out, Status status) {
  SendQueue::finish(out, std::move(status));
  announce_done(lock);
}

// Sends were marked done (lock held): wakes their waits, and a reader that
// sleeps on the channel, whose caller may wait for one of them.
void EndpointImpl::announce_done(const StateLock& lock) {
  wake_sleepers(lock);
  if (role_.held(lock) && !role_.held_by_this_thread(lock)) signal_eventfd(sends_wake_.get());
}

// Ends posted send `id` before its time, at its wait's deadline or once the
// endpoint broke (lock held, and held on return; it may wait a moment for a
// thread that moves it on). Once kDone, no byte of its message is read any
// more.
void EndpointImpl::cut_short(StateLock& lock, uint64_t id, Outgoing& out) {
  const Status why = broken_;
  switch (out.stage) {
    case Stage::kQueued: {
      auto& queued = sends_.queued(lock);
      queued.erase(std::find(queued.begin(), queued.end(), id));
      finish(lock, out, why.ok() ? DeadlineExceeded("the peer posted no receive in time") : why);
      return;
    }
    case Stage::kBusy:
      ++sleepers_;
      cv_.wait(lock, [&] { return out.stage != Stage::kBusy; });
      --sleepers_;
      return;
    case Stage::kAskingHandle:
      replies_.erase(out.request);  // a late answer is ignored
      SendQueue::move(out, Stage::kBusy);
      lock.unlock();
      conclude_write(lock, id, out,
                     why.ok() ? DeadlineExceeded("the peer did not send its receive's handle "
                                                 "in time")
                              : why,
                     /*may_retry=*/false);
      return;
    case Stage::kWriting: {
      SendQueue::move(out, Stage::kBusy);
      Transfer write = std::move(out.write);
      lock.unlock();
      write.cancel();  // from now on the message's memory is not read
      Status wrote = write.status();
      write = Transfer();
      if (!wrote.ok() && why.ok()) wrote = DeadlineExceeded("the write did not finish in time");
      conclude_write(lock, id, out, why.ok() ? wrote : why, /*may_retry=*/false);
      return;
    }
    case Stage::kDone:
      return;
  }
}

// Posted sends whose wait has not ended: every one cancelled, so that no
// write's on_done runs after the endpoint is gone (close()).
void EndpointImpl::cancel_writes() {
  std::vector<std::pair<Outgoing*, Transfer>> writes;
  StateLock lock(mu_);
  sends_.for_each(lock, [&writes](uint64_t, Outgoing& out) {
    if (out.stage != Stage::kWriting) return;
    SendQueue::move(out, Stage::kBusy);
    writes.emplace_back(&out, std::move(out.write));
  });
  lock.unlock();
  for (auto& [out, write] : writes)
    write.cancel();
  lock.lock();
  for (auto& [out, write] : writes) {
    out->write = std::move(write);
    SendQueue::move(*out, Stage::kWriting);  // its wait ends it
  }
  cv_.notify_all();
}

}  // namespace rdmabuf
