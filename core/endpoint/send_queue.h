// The sends an endpoint posted, from post_send() until their wait ends.
//
// A send's way, every step of it through move():
//
//   kQueued ------> kBusy ------> kDone
//     |  ^           |  ^
//     |  |           v  |
//     |  +------- kAskingHandle, kWriting
//     +-----------------------------> kDone   (cut short while queued)
//
//   kQueued        waiting for one of the peer's credits, in queued() order
//   kBusy          a thread is writing a frame for it or starting its write,
//                  and moves it on next; nobody else touches it meanwhile
//   kAskingHandle  its credit came without a handle: the receive's handle
//                  was asked for (kHandleWanted), the answer not come yet
//   kWriting       its one-sided write into the receive runs
//   kDone          its status is final; its wait erases it
//
// kBusy goes back to kQueued when the receive it took was withdrawn
// meanwhile: the message goes to the next receive. Every function needs the
// endpoint's state lock, which guards the queue.
#pragma once

#include <cassert>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>

#include "core/endpoint/frames.h"
#include "core/endpoint/numbered_slots.h"
#include "core/endpoint/state_lock.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf::endpoint {

enum class Stage { kQueued, kAskingHandle, kWriting, kBusy, kDone };

struct Outgoing {
  LocalMemory message;
  std::chrono::milliseconds write_timeout{0};
  Stage stage = Stage::kQueued;  // changed through SendQueue::move() alone
  Credit credit;                 // from kAskingHandle on
  uint64_t request = 0;          // kAskingHandle: the handle request's id
  Transfer write;                // kWriting
  bool write_done = false;       // kWriting: the write finished (its on_done ran)
  Status status;                 // kDone

  // As a new one, touching only what may be set (as Receive::reset): an
  // assignment from Outgoing() would zero its every byte first.
  void reset() {
    message = LocalMemory();
    write_timeout = std::chrono::milliseconds(0);
    stage = Stage::kQueued;
    credit.seq = credit.capacity = 0;
    if (credit.buffer.valid()) credit.buffer = RemoteBuffer();
    request = 0;
    write = Transfer();  // moved out by whoever ran it, but for a cut short one
    write_done = false;
    if (!status.ok()) status = Status();
  }
};

class SendQueue {
 public:
  // post_send()'s ids that name no queued send: the endpoint was broken
  // (nothing posted), or the outcome was known at once.
  static constexpr uint64_t kRefused = 0;
  static constexpr uint64_t kAnswered = ~uint64_t{0};

  // Queues `message`: its id (never kRefused nor kAnswered).
  uint64_t add(const StateLock&, const LocalMemory& message,
               std::chrono::milliseconds write_timeout) {
    const uint64_t id = next_id_++;
    Outgoing& out = sends_.add(id);
    out.message = message;
    out.write_timeout = write_timeout;
    queued_.push_back(id);
    return id;
  }
  Outgoing* find(const StateLock&, uint64_t id) { return sends_.find(id); }
  void erase(const StateLock&, uint64_t id) { sends_.erase(id); }
  template <typename F>
  void for_each(const StateLock&, F f) {
    sends_.for_each(f);
  }

  // Moves `out` to stage `to`: every change of stage goes through here
  // (see the top of this file for the moves allowed).
  static void move(Outgoing& out, Stage to) {
    assert(allowed(out.stage, to) && "a send moved between stages it may not");
    out.stage = to;
  }
  // `out` is done with `status`.
  static void finish(Outgoing& out, Status status) {
    move(out, Stage::kDone);
    out.status = std::move(status);
  }

  // Sends waiting for a credit, oldest first.
  std::deque<uint64_t>& queued(const StateLock&) { return queued_; }
  // Sends whose handle came or whose write finished: to move on.
  std::deque<uint64_t>& events(const StateLock&) { return events_; }
  bool has_events(const StateLock&) const { return !events_.empty(); }

  // Credits taken by a send, by their receive's seq: whether the receiver
  // withdrew the receive meanwhile.
  void take_credit(const StateLock&, uint64_t seq) { taken_[seq] = false; }
  // Marks a taken credit withdrawn: false when no send holds it.
  bool withdraw_taken(const StateLock&, uint64_t seq) {
    auto taken = taken_.find(seq);
    if (taken == taken_.end()) return false;
    taken->second = true;  // the send in progress answers when done
    return true;
  }
  // Ends the use of a taken credit: whether the receiver withdrew it.
  bool give_back_credit(const StateLock&, uint64_t seq) {
    auto it = taken_.find(seq);
    if (it == taken_.end()) return false;
    const bool withdrawn = it->second;
    taken_.erase(it);
    return withdrawn;
  }

 private:
  static constexpr bool allowed(Stage from, Stage to) {
    switch (from) {
      case Stage::kQueued:
        return to == Stage::kBusy || to == Stage::kDone;
      case Stage::kBusy:
        return to != Stage::kBusy;
      case Stage::kAskingHandle:
      case Stage::kWriting:
        return to == Stage::kBusy;
      case Stage::kDone:
        return false;
    }
    return false;
  }

  NumberedSlots<Outgoing> sends_;  // by id, until their wait ends
  std::deque<uint64_t> queued_;
  std::deque<uint64_t> events_;
  uint64_t next_id_ = 1;            // neither kRefused nor kAnswered, for ever
  std::map<uint64_t, bool> taken_;  // taken credits: withdrawn meanwhile?
};

}  // namespace rdmabuf::endpoint
