// Flow control of an endpoint's messages: credits.
//
// Every receive a side posts is a credit for its peer (a kPosted frame: the
// receive's seq, its capacity and maybe its handle), and every message or
// answer uses one up. The peer sends only against a credit, so nothing is
// ever written that no receive waits for.
//
// This side holds its credits back, to go with the next frame it writes (one
// write then carries, say, a receive's credit and the message behind it,
// or several credits), until they are due: once they are as many as the
// credits the peer still holds (or it holds none), the peer may be waiting
// for them. The credits the peer sent and no send has taken yet wait in
// peer().
//
// Locks: the credits held back change under the endpoint's frames lock
// (the state lock where writes never wait, else a lock of their own); the
// peer's under the state lock. The counts are read without a lock, for a
// heuristic.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>

#include "common/ring_queue.h"
#include "core/endpoint/frames.h"
#include "core/endpoint/state_lock.h"

namespace rdmabuf::endpoint {

// Credits held back are written at once when their frames reach this many
// bytes: about 170 receives' worth.
constexpr size_t kMostHeldBack = 4096;

class Credits {
 public:
  // --- this side's, held back (frames lock held) ---

  // Holds back the credit of receive `seq` (`handle`: its handle's bytes,
  // or none). True at kMostHeldBack bytes: the caller writes them now.
  bool hold(uint64_t seq, uint64_t capacity, std::span<const uint8_t> handle) {
    append_credit(held_, seq, capacity, handle);
    // Seq_cst, against the endpoint server's look before it sleeps
    // (EndpointImpl::server_wait); stored only when it was false (a locked
    // instruction less for all but the first of a batch: 4 KiB streams 2%
    // faster). It changes only under the frames lock, so true here means
    // the store that made it so came before, and the write that clears it
    // will carry this credit too.
    if (!any_held_.load(std::memory_order_relaxed)) any_held_.store(true);
    held_count_.store(held_count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return held_.size() >= kMostHeldBack;
  }
  // The frames held back, to go in front of the next write.
  std::span<const uint8_t> held() const { return held_; }
  // They went out with a write (frames lock held).
  void sent() {
    if (held_.empty()) return;
    held_.clear();
    any_held_.store(false, std::memory_order_relaxed);
    // These counts change under the frames lock alone: no read-modify-write.
    sent_.store(sent_.load(std::memory_order_relaxed) + held_count_.load(std::memory_order_relaxed),
                std::memory_order_relaxed);
    held_count_.store(0, std::memory_order_relaxed);
  }
  // Whether any are held back: a seq_cst load (see hold()), or a relaxed
  // one where a moment's lag costs nothing.
  bool any_held() const { return any_held_.load(); }
  bool any_held_now() const { return any_held_.load(std::memory_order_relaxed); }

  // Whether those held back are due now, not with the next frame: once they
  // are as many as the peer still holds (or it holds none). A sender with
  // more credits left than that is not waiting for these: the receive it
  // answers next is an older one.
  bool due() const { return held_count_.load(std::memory_order_relaxed) >= outstanding(); }

  // A message or an answer used up one of the credits sent (the state lock
  // orders every change of this count: no read-modify-write).
  void used(const StateLock&) {
    used_.store(used_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  // --- the peer's, not yet taken (state lock held) ---
  RingQueue<Credit>& peer(const StateLock&) { return peer_; }
  const RingQueue<Credit>& peer(const StateLock&) const { return peer_; }

 private:
  // The credits sent that the peer has not used yet: a count for a
  // heuristic, read without a lock (a moment off, even below 0: the peer
  // may use a credit before sent_ counts it).
  int64_t outstanding() const {
    const int64_t used = used_.load();
    return sent_.load() - used;
  }

  SmallBytes<512> held_;  // room in place for those of the bench's 16 receives
  std::atomic<bool> any_held_{false};
  std::atomic<int64_t> held_count_{0};
  std::atomic<int64_t> sent_{0};  // frames lock held
  std::atomic<int64_t> used_{0};  // state lock held
  RingQueue<Credit> peer_;
};

}  // namespace rdmabuf::endpoint
