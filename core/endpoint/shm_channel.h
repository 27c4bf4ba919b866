// A same-host byte channel for endpoints: two single-producer,
// single-consumer rings in one shared memory file (a memfd), one ring per
// direction. Two processes on one host exchange an endpoint's frames
// through it with plain loads and stores, no system call per frame.
//
// Each write goes into its ring as one record: a header word (its length
// and a mark), then its bytes, starting on a cache line of its own. The
// reader polls the word where the next record's header will be, not a
// shared count of bytes written: a small message then costs one cache line
// to cross between the cores, not two (the count's line, then the bytes').
// A writer zeroes the word after its record before it stores the record's
// header, so what the reader finds there is either nothing yet (zero) or a
// header, never a byte of an earlier lap.
//
// The endpoint's TCP connection stays beside it, for two things the rings
// cannot do: waking a reader that sleeps (a doorbell, one byte, sent only
// when the reader asked for one), and telling that the peer has gone (the
// connection's end).
//
// Contract: one thread at a time writes (the endpoint holds its write lock),
// one at a time reads (the endpoint's reader role). The peer can write any
// bytes into the shared file; every header and position it wrote is checked
// before it is used, so a corrupt or hostile peer gets kProtocolError, never
// an access outside the rings.
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
  // that the file opened is the one offered. The endpoint handshake adds the
  // creator's descriptor of the connection the offer travels on
  // (`socket_fd`), so that the accepting side checks, before it opens
  // anything, that the pid is the peer's (common/socket_holder.h).
  struct Offer {
    uint32_t pid = 0;
    uint32_t fd = 0;
    uint32_t socket_fd = 0;
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

  // Copies all the bytes of `first`, then of `pieces`, into the outgoing
  // ring as one record, or none when it has not room for them all: whether
  // it did. A record never wraps round the ring's end, so the reader's
  // peek() sees it in one piece. kProtocolError when the peer corrupted the
  // ring; kInvalidArgument for more than most_whole_write() bytes.
  Result<bool> write_whole(std::span<const uint8_t> first,
                           std::span<const std::span<const uint8_t>> pieces);
  // Copies up to `size` bytes out of the incoming ring, across records: how
  // many, 0 when it is empty. kProtocolError when the peer corrupted the
  // ring and nothing could be copied before the corruption.
  Result<size_t> read_some(uint8_t* out, size_t size);
  // Whether the incoming ring holds bytes: one load, for a reader that
  // spins. (It may say so for a record the peer corrupted: peek() tells.)
  bool has_incoming() const {
    return in_head_ != in_record_end_ || next_record_word(std::memory_order_acquire) != 0;
  }
  // The bytes of the incoming record from the read position on (the next
  // record's, when this one is all read): a view into the shared file, for
  // a reader that takes them in place, then calls consume(). Empty when
  // nothing came. The peer can write into them meanwhile: check a copy,
  // never the view twice. kProtocolError when the peer corrupted the ring.
  // Inline, as consume(): a reader takes two or three frames a message.
  Result<std::span<const uint8_t>> peek() {
    if (in_head_ == in_record_end_) {  // all read: the next record's header
      const uint64_t at = in_record_end_aligned();
      const uint64_t word = incoming_word(at, std::memory_order_acquire);
      if (word == 0) return std::span<const uint8_t>();
      if (!is_record(at, word)) [[unlikely]]
        return follow_wrap(at, word);
      start_record(at, word);
    }
    return std::span<const uint8_t>(in_data_ + (in_head_ & (kRingBytes - 1)),
                                    in_record_end_ - in_head_);
  }
  // The incoming ring where this side maps it: every view peek() gives lies
  // within (for checks).
  std::span<const uint8_t> incoming_ring() const { return {in_data_, kRingBytes}; }
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
  // woken. A writer calls doorbell_requested() after each write_whole: true
  // once per request, and then it sends a doorbell.
  //
  // The request and the write race (a reader stores its request, then
  // loads the next header; a writer stores that header, then loads the
  // request), so one of the two needs a full fence between its store and
  // its load. The writer writes on every message and the reader asks only
  // before it sleeps, so where the kernel offers membarrier(2)'s
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

  // Where each side waits. A reader about to spin on the incoming ring
  // says which CPU it runs on (sched_getcpu), and asks where the peer's
  // reader last said it ran: when on the same CPU, spinning keeps the
  // peer from running (the endpoint's reader yields instead: core/endpoint/
  // progress_templates.h). A store only when the CPU changed, so that the line
  // stays in both caches. The peer's value is a hint: a hostile peer can
  // only make this side yield, or not.
  bool peer_waits_on_this_cpu();

  // Each ring's capacity in bytes, records' headers and padding included.
  static constexpr size_t ring_bytes() { return kRingBytes; }
  // The most bytes one write_whole() takes: what fits an empty ring
  // wherever its write position lies (a record does not wrap).
  static constexpr size_t most_whole_write() { return kRingBytes / 2 - 2 * kRecordAlign; }
  // How a record's bytes lie in the ring: each starts on a line of its own
  // with its header word, and the next starts past its bytes, rounded up.
  static constexpr size_t record_align() { return kRecordAlign; }

 private:
  // A power of two, and larger than a core's L2 (1 MiB on the AMD EPYC host
  // measured): by the time the writer comes round to a line again, the
  // reader's copy of it has left the reader's L2, so the writer's store
  // need not take the line from the other core first. With 512 KiB rings,
  // 4 KiB messages streamed at 7.1-7.5 GB/s there (UCX: 8.3-8.6); with
  // 2 MiB ones at 9-22.
  static constexpr size_t kRingBytes = size_t{2048} << 10;
  static_assert((kRingBytes & (kRingBytes - 1)) == 0);
  static constexpr uint64_t kLineBytes = 64;
  static constexpr size_t kRecordAlign = kLineBytes;
  static constexpr size_t kDemoteMost = 1024;  // see publish()
  // A record's header word: its length in the low 32 bits, a mark in the
  // high ones. Zero: no record yet. kWrapMark: none until the ring's end,
  // the next is at the start of the next lap.
  static constexpr uint64_t kRecordMark = 0x52454331;  // "REC1"
  static constexpr uint64_t kWrapMark = 0x57524150;    // "WRAP"
  // Positions and flags are shared with another process: only lock-free
  // atomics work across address spaces.
  static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                std::atomic_ref<uint32_t>::is_always_lock_free);

  // Where a ring's reader last began to wait: its CPU + 1; 0 until it says.
  // On a line of its own, after both rings' controls (a peer of an earlier
  // version neither writes nor reads it: 0 to this side).
  struct alignas(64) WaiterCpu {
    uint32_t cpu_plus_one;
  };
  struct Layout;
  // One direction. Each field on a cache line of its own: the consumer
  // writes `head` (bytes ever read, headers and padding included);
  // `doorbell` is set by the consumer and taken by the producer. (Here, not
  // in the .cc: consume() is inline.)
  struct alignas(64) RingControl {
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
  // The header word of the incoming ring at position `at` (a record's start).
  uint64_t incoming_word(uint64_t at, std::memory_order order) const {
    auto* word = reinterpret_cast<uint64_t*>(in_data_ + (at & (kRingBytes - 1)));
    return std::atomic_ref<uint64_t>(*word).load(order);
  }
  // The word where the record after the current one starts.
  uint64_t next_record_word(std::memory_order order) const {
    return incoming_word(in_record_end_aligned(), order);
  }
  uint64_t in_record_end_aligned() const { return record_aligned(in_record_end_); }
  // `position` rounded up to where a record may start.
  static uint64_t record_aligned(uint64_t position) {
    return (position + kRecordAlign - 1) & ~uint64_t{kRecordAlign - 1};
  }
  // Whether `word`, found at position `at`, is the header of a record that
  // lies within the ring (the bytes of a peer that writes as this side).
  static bool is_record(uint64_t at, uint64_t word) {
    const uint64_t size = word & 0xffffffff;
    return word >> 32 == kRecordMark && size != 0 && size <= most_whole_write() &&
           (at & (kRingBytes - 1)) + sizeof(uint64_t) + size <= kRingBytes;
  }
  // Reads the record whose header `word` is, at `at`.
  void start_record(uint64_t at, uint64_t word) {
    in_head_ = at + sizeof(uint64_t);
    in_record_end_ = in_head_ + (word & 0xffffffff);
  }
  // peek() of a `word` at `at` that is not a record's header: the record
  // that a wrap mark leads to, at the next lap's start. kProtocolError for
  // anything else; nothing moves then.
  Result<std::span<const uint8_t>> follow_wrap(uint64_t at, uint64_t word);
  // The outgoing ring's free bytes, loading the reader's head only when
  // fewer than `wanted` were free when last loaded.
  Result<size_t> room_for(size_t wanted);
  // The word of the outgoing ring at position `at` (a record's start, or
  // the word after one), for atomic stores: incoming_word()'s twin.
  uint64_t& outgoing_word(uint64_t at) const {
    return *reinterpret_cast<uint64_t*>(out_data_ + (at & (kRingBytes - 1)));
  }
  // Copies `piece` into the outgoing ring at offset `at` (room checked).
  void copy_in(std::span<const uint8_t> piece, size_t at);
  // Stores the header word `word` at position `at` of the outgoing ring,
  // the write's last store: it makes the record (and any before it) the
  // reader's. After a small record (up to kDemoteMost bytes), its lines are
  // demoted where the CPU can (demotes_): pushed out of this core's caches
  // into the shared one, where the reader that polls finds them sooner. On
  // a 2-core Intel host, 8 B messages went one way in 0.25-0.26 us instead
  // of 0.28-0.29, 1 KiB in 0.58 instead of 0.63-0.66.
  void publish(uint64_t at, uint64_t word, size_t record_bytes);
  void zero_word(uint64_t at);

  Fd fd_;
  void* base_ = nullptr;
  uint64_t nonce_ = 0;
  // Where the rings lie in the mapping, worked out once.
  RingControl* out_control_;  // of the ring this side writes
  uint8_t* out_data_;
  RingControl* in_control_;  // of the ring this side reads
  WaiterCpu* own_cpu_;       // this side's reader's
  WaiterCpu* peer_cpu_;      // the peer's reader's
  uint8_t* in_data_;         // written by the peer only (atomic_ref needs no const)
  // This side's own positions, never read back from the shared file: where
  // the next record goes (a multiple of kRecordAlign), the next byte to
  // read, and the end of the bytes of the record being read (in_head_
  // there: all read; the next record's header is at that, rounded up).
  uint64_t out_tail_ = 0;
  uint64_t in_head_ = 0;
  uint64_t in_record_end_ = 0;
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
