// The receives an endpoint posted, by sequence number, and what the peer
// answered each with.
//
// Every posted receive gets exactly one answer from the peer: the message
// (inline, in parts, or written one-sided and then kSent), kTooLarge or
// kNotTaken. answer() and fill() take those frames, check them against the
// receive (a peer that lies is a kProtocolError, and nothing of its lands
// in memory it was not given), and copy inline messages and parts into
// the receive's memory. A receive given up (abandoned) keeps its slot
// until its answer comes, which is then dropped.
//
// Every function needs the endpoint's state lock, which guards the table:
// the memory of a receive is valid while its slot lives, since only the
// wait that ends it erases it, under the lock.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/copy.h"
#include "common/cuda_driver.h"
#include "core/endpoint/credits.h"
#include "core/endpoint/frames.h"
#include "core/endpoint/numbered_slots.h"
#include "core/endpoint/state_lock.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/memory.h"

namespace rdmabuf::endpoint {

struct Receive {
  LocalMemory into;
  RemoteBuffer handle;  // `into`, registered, once a message may need it
  // GPU memory no transport here reaches (register_receive): `handle` is
  // this host memory's, and a one-sided message is copied to `into` from it
  // once it has landed.
  LocalMemory bounce;
  bool abandoned = false;  // given up unanswered: drop the answer
  bool withdrawn = false;  // timed out: its memory is not the peer's any more
  bool answered = false;
  bool written = false;  // the message came by one-sided write (kSent), not in frames
  Status status;         // kSent: OK; kTooLarge: InvalidArgument; kNotTaken: DeadlineExceeded
  uint64_t size = 0;
  // A message coming in kSentPart frames: its size, and the bytes come.
  uint64_t parts_size = 0;
  uint64_t parts_came = 0;

  // As a new one: lets go of its memory, and touches only what is set (an
  // assignment from Receive() would store every field and take the
  // status' and handle's references apart, on every message's path).
  void reset() {
    into = LocalMemory();
    if (handle.valid()) handle = RemoteBuffer();
    if (bounce.data()) bounce = LocalMemory();
    if (!status.ok()) status = Status();
    abandoned = withdrawn = answered = written = false;
    size = parts_size = parts_came = 0;
  }
};

class ReceiveTable {
 public:
  // Posts `into` (with its `handle`, when registered, and the `bounce`
  // memory the handle is of, if any): its sequence number.
  uint64_t add(const StateLock&, const LocalMemory& into, RemoteBuffer handle,
               const LocalMemory& bounce) {
    const uint64_t seq = next_seq_++;
    Receive& posted = slots_.add(seq);
    posted.into = into;
    if (handle.valid()) posted.handle = std::move(handle);  // a slot starts without one
    if (bounce.data()) posted.bounce = bounce;
    return seq;
  }
  Receive* find(const StateLock&, uint64_t seq) { return slots_.find(seq); }
  void erase(const StateLock&, uint64_t seq) { slots_.erase(seq); }
  // Receive `seq` when it still waits for the peer's message: not given up,
  // withdrawn or answered.
  Receive* open(const StateLock& lock, uint64_t seq) {
    Receive* receive = find(lock, seq);
    if (receive == nullptr) return nullptr;
    return receive->abandoned || receive->withdrawn || receive->answered ? nullptr : receive;
  }

  // The answer of `type` (kSent, kTooLarge, kNotTaken, kSentInline with its
  // message) for one of the receives; `credits` counts the credit used.
  [[gnu::always_inline]] Status answer(const StateLock& lock, Frame type,
                                       const MessageAnswer& answer, Credits& credits) {
    Receive* answered = slots_.find(answer.seq);
    if (answered == nullptr || answered->answered) {
      return ProtocolError("endpoint answer for receive " + std::to_string(answer.seq) +
                           ", which is not waiting");
    }
    credits.used(lock);
    Receive& receive = *answered;
    if (receive.parts_came != 0) {
      return ProtocolError("endpoint answer for receive " + std::to_string(answer.seq) +
                           ", amid its message's parts");
    }
    if (receive.abandoned) {
      slots_.erase(answer.seq);  // nobody waits for it; its memory is not ours to fill
      return Status::Ok();
    }
    const bool message = type == Frame::kSent || type == Frame::kSentInline;
    if (message && answer.size > receive.into.size()) {
      return ProtocolError("the peer says it sent more than the receive holds");
    }
    receive.answered = true;
    receive.written = type == Frame::kSent;
    receive.size = answer.size;
    // The next receives register when posted while messages are large.
    if (message) register_when_posted_.store(type == Frame::kSent, std::memory_order_relaxed);
    // kSent, kSentInline: the status stays OK, as every receive starts.
    if (type == Frame::kSentInline) {
      if (answer.size > 0) copy_into(receive, 0, answer.data);
    } else if (type == Frame::kTooLarge) {
      receive.status = InvalidArgument("the peer's message of " + std::to_string(answer.size) +
                                       " bytes does not fit this receive");
    } else if (type == Frame::kNotTaken) {
      receive.status = DeadlineExceeded("no message came in time");
    }
    return Status::Ok();
  }

  // The next part of the message for one of the receives: copied into its
  // memory; the receive is answered once every byte came (an abandoned one
  // drops them).
  Status fill(const StateLock& lock, const MessagePart& part, Credits& credits);

  // Whether a receive too large for an inline message registers its memory
  // when posted: while the messages lately were too (read without a lock).
  bool register_when_posted() const {
    return register_when_posted_.load(std::memory_order_relaxed);
  }

 private:
  // Under the state lock: the receive has not returned, nor been abandoned
  // (which is marked under the lock), so its memory is valid. Out of line:
  // inlined into a reader, the compiler turned the copy of a large message
  // into `rep movsq`, where memcpy picks the best copy for the size.
  // Into GPU memory through the driver; a failure there fails the receive.
  [[gnu::noinline]] static void copy_into(Receive& receive, uint64_t at,
                                          std::span<const uint8_t> data) {
    if (receive.into.on_gpu()) {
      Status copied = cuda::copy_into(receive.into, at, data.data(), data.size());
      if (!copied.ok() && receive.status.ok()) receive.status = copied;
      return;
    }
    copy_received(receive.into.data() + at, data.data(), data.size());
  }

  NumberedSlots<Receive> slots_;
  uint64_t next_seq_ = 0;
  std::atomic<bool> register_when_posted_{true};
};

}  // namespace rdmabuf::endpoint
