// A same-host byte channel for endpoints: two single-producer,
// single-consumer byte rings in one shared memory file (a memfd), one ring
// per direction. Two processes on one host exchange an endpoint's frames
// through it with plain loads and stores, no system call per frame.
//
// The endpoint's TCP connection stays beside it, for two things the rings
// cannot do: waking a reader that sleeps (a doorbell, one byte, sent only
// when the reader asked for one), and telling that the peer has gone (the
// connection's end).
//
// Contract: one thread at a time writes (the endpoint holds its write lock),
// one at a time reads (the endpoint's reader role). The peer can write any
// bytes into the shared file; every position it wrote is checked before it
// is used, so a corrupt or hostile peer gets kProtocolError, never an access
// outside the rings.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/socket.h"
#include "rdmabuf/status.h"

namespace rdmabuf {

class ShmChannel {
 public:
  // What the accepting side needs to open the creator's file: the creator's
  // process and descriptor (opened through /proc/PID/fd/FD), where that pid
  // means something, and a random nonce written into the file, which proves
  // that the file opened is the one offered.
  struct Offer {
    uint32_t pid = 0;
    uint32_t fd = 0;
    uint64_t pid_namespace = 0;
    uint64_t nonce = 0;
    std::string host_id;
  };

  // The connecting side: a new file with empty rings. It writes ring 0 and
  // reads ring 1.
  static Result<std::unique_ptr<ShmChannel>> create();
  // The accepting side: opens what `offer` names. It writes ring 1 and reads
  // ring 0. kFailedPrecondition, with the reason, when the file cannot be
  // used from here (another host or PID namespace, no permission, not the
  // file offered).
  static Result<std::unique_ptr<ShmChannel>> open(const Offer& offer);

  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // How the peer opens this side's file (the creator's only).
  Offer offer() const;

  // Copies up to `size` bytes into the outgoing ring: how many fitted, 0
  // when it is full. kProtocolError when the peer corrupted the ring.
  Result<size_t> write_some(const uint8_t* data, size_t size);
  // The same for the bytes of `pieces` in turn, after skipping `skip` of
  // them: a frame's header and its payload with no copy in between, and
  // published to the reader at once.
  Result<size_t> write_some(std::span<const std::span<const uint8_t>> pieces, size_t skip);
  // Copies all the bytes of `first`, then of `pieces`, into the outgoing
  // ring, or none when it has not room for them all: whether it did.
  // kProtocolError when the peer corrupted the ring; kInvalidArgument for
  // more than ring_bytes().
  Result<bool> write_whole(std::span<const uint8_t> first,
                           std::span<const std::span<const uint8_t>> pieces);
  // Copies up to `size` bytes out of the incoming ring: how many, 0 when it
  // is empty. kProtocolError when the peer corrupted the ring.
  Result<size_t> read_some(uint8_t* out, size_t size);
  // Whether the incoming ring holds bytes: one load, for a reader that
  // spins.
  bool has_incoming() const {
    return std::atomic_ref<uint64_t>(in_control_->tail).load(std::memory_order_acquire) != in_head_;
  }
  // The bytes the incoming ring holds from the read position on, as far as
  // they lie in one piece (to the ring's end): a view into the shared file,
  // for a reader that takes them in place, then calls consume(). The peer
  // can write into them meanwhile: check a copy, never the view twice.
  // kProtocolError when the peer corrupted the ring.
  // Inline, as consume(): a reader takes two or three frames a message.
  Result<std::span<const uint8_t>> peek() {
    const uint64_t tail =
        std::atomic_ref<uint64_t>(in_control_->tail).load(std::memory_order_acquire);
    const uint64_t held = tail - in_head_;
    if (held > kRingBytes) [[unlikely]]
      return corrupted();
    const size_t at = in_head_ & (kRingBytes - 1);
    return std::span<const uint8_t>(in_data_ + at, std::min<size_t>(held, kRingBytes - at));
  }
  // Gives `size` bytes of a peek() back to the writer (at most those).
  void consume(size_t size) {
    in_head_ += size;
    // The room is the writer's again.
    std::atomic_ref<uint64_t>(in_control_->head).store(in_head_, std::memory_order_release);
  }

  // Doorbells. A reader that found the incoming ring empty and is about to
  // sleep on the TCP connection calls request_doorbell() first: false when
  // bytes came meanwhile (read them; do not sleep). The request stays until
  // the writer takes it, so that every reader of this side that sleeps is
  // woken. A writer calls doorbell_requested() after each write_some: true
  // once per request, and then it sends a doorbell.
  //
  // The request and the write race (a reader stores its request, then
  // loads the tail; a writer stores the tail, then loads the request), so
  // one of the two needs a full fence between its store and its load. The
  // writer writes on every message and the reader asks only before it
  // sleeps, so where the kernel offers membarrier(2)'s
  // MEMBARRIER_CMD_GLOBAL_EXPEDITED, the reader pays for both: it makes
  // every running thread of the writer's process pass a fence, and the
  // writer publishes with a plain store (a locked instruction less per
  // write, which stalls until the write's cache lines are its own). Each
  // side says in the file whether it reads that way; where either side
  // cannot, the writer fences as before.
  bool request_doorbell();
  bool doorbell_requested();
  // Whether this side's writes skip the fence (see above): both processes
  // registered with membarrier and the peer's reader said so.
  bool writes_without_fence() const {
    return asymmetric_fences_ &&
           std::atomic_ref<uint32_t>(out_control_->reader_fences).load(std::memory_order_relaxed) !=
               0;
  }

  // Each ring's capacity in bytes.
  static constexpr size_t ring_bytes() { return kRingBytes; }

 private:
  // A power of two, and larger than a core's L2 (1 MiB on the AMD EPYC host
  // measured): by the time the writer comes round to a line again, the
  // reader's copy of it has left the reader's L2, so the writer's store
  // need not take the line from the other core first. With 512 KiB rings,
  // 4 KiB messages streamed at 7.1-7.5 GB/s there (UCX: 8.3-8.6); with
  // 2 MiB ones at 9-22 (docs/performance.md, twenty-first session).
  static constexpr size_t kRingBytes = size_t{2048} << 10;
  static_assert((kRingBytes & (kRingBytes - 1)) == 0);
  static constexpr uint64_t kLineBytes = 64;
  static constexpr size_t kDemoteMost = 1024;  // see publish()
  // Positions and flags are shared with another process: only lock-free
  // atomics work across address spaces.
  static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                std::atomic_ref<uint32_t>::is_always_lock_free);

  struct Layout;
  // One direction. Each field on a cache line of its own: the producer
  // writes `tail`, the consumer `head`; `doorbell` is set by the consumer
  // and taken by the producer. (Here, not in the .cc: peek() and
  // consume() are inline.)
  struct alignas(64) RingControl {
    alignas(64) uint64_t tail;
    alignas(64) uint64_t head;
    alignas(64) uint32_t doorbell;
    // Set once by the reader when it fences for the writer before it
    // sleeps (membarrier), read by the writer at each publish. Beside the
    // doorbell, which the writer loads then anyway.
    uint32_t reader_fences;
  };
  [[gnu::cold]] static Status corrupted();
  ShmChannel(Fd fd, void* base, uint64_t nonce, int writes_ring);
  Layout& layout() const;
  // Says in the file, before this side's reader first asks for a doorbell,
  // that it fences for the peer's writer (when it does): the peer's writes
  // may skip their fence from the moment it sees this.
  void announce_reader_fences();
  // The outgoing ring's free bytes, loading the reader's head only when
  // fewer than `wanted` were free when last loaded.
  Result<size_t> room_for(size_t wanted);
  // Copies `piece` into the outgoing ring `offset` bytes past the tail
  // (room checked); publish() then makes the bytes the reader's.
  void copy_in(std::span<const uint8_t> piece, size_t offset);
  // Makes `size` bytes written past the tail the reader's. After a small
  // write (up to kDemoteMost bytes), the lines written and the tail's are
  // demoted first where the CPU can (demotes_): pushed out of this core's
  // caches into the shared one, where the reader that polls the tail finds
  // them sooner. 8 B messages went one way in 0.25-0.26 us instead of
  // 0.28-0.29, 1 KiB in 0.58 instead of 0.63-0.66, and small messages
  // streamed 4-5% faster (docs/performance.md, fourteenth session).
  void publish(size_t size);
  // Demotes the lines of the `size` bytes past the tail.
  void demote_written(size_t size);

  Fd fd_;
  void* base_ = nullptr;
  uint64_t nonce_ = 0;
  // Where the rings lie in the mapping, worked out once.
  RingControl* out_control_;  // of the ring this side writes
  uint8_t* out_data_;
  RingControl* in_control_;  // of the ring this side reads
  const uint8_t* in_data_;
  uint64_t out_tail_ = 0;  // this side's own positions, never read back
  uint64_t in_head_ = 0;   // from the shared file
  // The reader's head as this side last loaded it: there is at least this
  // much room, so the writer loads the peer's line only when that is not
  // enough (a cache line less to move per frame).
  uint64_t out_head_ = 0;
  // This process is registered for membarrier's global expedited fences:
  // its writes may skip the fence when the peer's reader fences for them,
  // and its reader fences for the peer's writes before it sleeps.
  bool asymmetric_fences_ = false;
  // The CPU can demote a cache line (CLDEMOTE): see publish().
  bool demotes_ = false;
};

}  // namespace rdmabuf
