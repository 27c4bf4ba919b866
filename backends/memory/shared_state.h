// The state an owner shares with same-host readers so that they can copy
// its buffers with no thread of the owner involved, and still never touch a
// released buffer.
//
// One segment per owning manager (a memfd, mapped by the owner and by every
// reader that opens /proc/<owner pid>/fd/<fd>):
//
//   header | slots[kSlots] | pins[kPins]
//
// A slot describes one registered buffer: `state` = generation << 1 | live,
// and the buffer's base address, size and token. A handle names its slot
// and generation. A pin entry is claimed by a reader thread for the length
// of one copy: `holder` = pid << 32 | tid, `target` = the slot and
// generation it copies from.
//
// Reader:  claim an entry, raise `pins_used` past it, store target
//          (seq_cst), then load the slot's
//          state (seq_cst): not the handle's generation, or not live, means
//          the buffer is gone: unpin, kNotFound. Else copy, then unpin.
// Owner:   release stores the slot's state dead (seq_cst), then scans the
//          pins below `pins_used` (seq_cst: a target stored before the
//          state store comes after its raise) and waits while an entry targets the slot, unless its
//          holder is dead (the entry is reaped) or stopped (a stopped thread is not inside a copy:
//          the kernel stops a task only on its way back to user space; it will unpin, and its next
//          copy sees the slot dead).
// Dekker's argument on target/state makes one side always see the other.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/socket.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/status.h"

namespace rdmabuf::memory {

constexpr uint64_t kSegmentMagic = 0x3274617473627264ull;  // "rdbstat2"
constexpr uint32_t kSlots = 16384;
constexpr uint32_t kPins = 4096;

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint64_t manager_id;
  uint32_t slots;
  uint32_t pins;
  uint32_t owner_pid;
  // One past the highest pin entry any reader ever claimed: release scans
  // only below it (a few entries, not kPins).
  std::atomic<uint32_t> pins_used;
};

struct alignas(64) Slot {
  std::atomic<uint64_t> state;  // generation << 1 | live
  uint64_t base;                // written before `state` publishes them
  uint64_t size;
  uint8_t token[16];
};

struct alignas(16) PinEntry {
  std::atomic<uint64_t> holder;  // pid << 32 | tid; 0 when free
  std::atomic<uint64_t> target;  // slot_target(); 0 when none
};

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

constexpr size_t segment_bytes() {
  return sizeof(SegmentHeader) + sizeof(Slot) * kSlots + sizeof(PinEntry) * kPins;
}

// What a pin entry's target holds for (slot, generation); never 0.
inline uint64_t slot_target(uint32_t slot, uint64_t generation) {
  return (generation << 24) | (static_cast<uint64_t>(slot) + 1);
}

// A mapping of a segment: the owner's own, or a reader's view of an owner's.
class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Owner: a new segment for `manager_id`.
  static Result<std::unique_ptr<Segment>> create(uint64_t manager_id);
  // Reader: maps the owner's segment through /proc/<pid>/fd/<fd> and checks
  // that it belongs to `manager_id`. The error says why it cannot be used.
  static Result<std::unique_ptr<Segment>> open(pid_t pid, int fd, uint64_t manager_id);

  int fd() const { return fd_.get(); }
  const void* address() const { return base_; }
  SegmentHeader& header() const { return *static_cast<SegmentHeader*>(base_); }
  Slot& slot(uint32_t index) const;
  PinEntry& pin(uint32_t index) const;

 private:
  Fd fd_;
  void* base_ = nullptr;
};

// The owner's bookkeeping over its segment.
class SlotTable {
 public:
  explicit SlotTable(Segment& segment);
  // Publishes a buffer; returns its slot and generation.
  // kResourceExhausted when every slot is in use.
  Result<std::pair<uint32_t, uint64_t>> publish(const void* base, uint64_t size,
                                                const Token& token);
  // Retracts the buffer in `slot`; returns once no reader is inside a copy
  // from it (see the header comment).
  void retract(uint32_t slot);

 private:
  Segment& segment_;
  std::mutex mu_;
  std::vector<uint32_t> free_;
};

// A reader's claim on one pin entry of an owner's segment.
class Pin {
 public:
  Pin() = default;
  ~Pin() { reset(); }
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;

  // Claims an entry for (slot, generation) and checks that the buffer is
  // still live. kNotFound when it is not; kResourceExhausted when every
  // entry is busy with live holders.
  Status acquire(Segment& segment, uint32_t slot, uint64_t generation);
  void reset();

 private:
  PinEntry* entry_ = nullptr;
};

// True when the thread `holder` (pid << 32 | tid) no longer exists.
bool holder_is_gone(uint64_t holder);
// True when the thread `holder` is stopped or traced (so not in a syscall).
bool holder_is_stopped(uint64_t holder);

}  // namespace rdmabuf::memory
