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
// generation it copies from, and once the copy's ranges are built, where
// its iovec arrays lie in the holder's own memory (`armed`).
//
// Reader:  claim an entry, raise `pins_used` past it, store target
//          (seq_cst), then load the slot's state (seq_cst): not the handle's
//          generation, or not live, means the buffer is gone: unpin,
//          kNotFound. Build the ranges, publish their iovecs (seq_cst),
//          load the state again (seq_cst): gone means unpin, kNotFound.
//          Else copy, unless `cancelled` is set; then unpin.
// Owner:   release stores the slot's state dead (seq_cst), then scans the
//          pins below `pins_used` (seq_cst: a target stored before the state
//          store comes after its raise) and waits while an entry targets
//          the slot. A holder that died is reaped. A holder that stays
//          stopped (SIGSTOP, a debugger, strace at a system call's entry)
//          for kStoppedReaderGrace has its copy cancelled: the owner empties
//          the published iovecs in the holder's memory (process_vm_writev),
//          sets `cancelled`, and looks once more: a thread stopped at both
//          looks is not inside a system call (the kernel stops a task only
//          on its way back to user space, or at a system call's entry,
//          before the call reads its iovecs), so any copy it made between
//          the looks has returned, and the next one moves nothing. Its op
//          fails with kNotFound. A holder that published nothing yet will
//          see the slot dead when it does. A holder that is running is
//          waited for, however long.
// Dekker's argument on target/state, and on the iovecs/state, makes one side
// always see the other.
//
// A buffer in GPU memory is published with its allocation's CUDA IPC handle,
// and readers copy it through the CUDA driver (backends/memory/gpu_copy.h)
// under the same pins. A buffer in host memory that lies in a shared file
// (common/file_backing.h) is published with the file: readers map it once
// (backends/memory/file_mappings.h) and copy with loads and stores, under
// the same pins. Neither copy can be emptied from outside (the driver's
// copy, or the reader's own loads and stores): its pin entry is armed as
// kUncancellableCopy, and release waits for it even while its holder is
// stopped (until the holder resumes or exits). Every retraction counts in
// the header's `retractions`, which readers watch to drop the mappings of
// released buffers.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/cuda_api.h"
#include "common/socket.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/status.h"

namespace rdmabuf::memory {

constexpr uint64_t kSegmentMagic = 0x3574617473627264ull;  // "rdbstat5"
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
  // How many buffers the owner has retracted, ever: a reader that sees it
  // move drops its mappings of buffers no longer live.
  std::atomic<uint64_t> retractions;
};

// Where a buffer in GPU memory lies, for readers in other processes.
struct GpuExport {
  uint64_t allocation_base = 0;  // the driver allocation holding it, in the owner
  cuda::CUipcMemHandle ipc{};    // that allocation's
  char pci_bus_id[16] = {};      // its GPU's, so a reader can find the same one
};

// Where a buffer in a shared file lies, for readers in other processes.
struct FileExport {
  uint64_t offset = 0;  // of the buffer's first byte within the file
  uint64_t device = 0;  // the file's st_dev and st_ino: a reader checks that
  uint64_t inode = 0;   //   the file it opened is this one
  uint32_t fd = 0;      // the owner's descriptor of it, open while published
  uint32_t sealed = 0;  // 1: sealed against shrinking
};

struct alignas(64) Slot {
  std::atomic<uint64_t> state;  // generation << 1 | live
  uint64_t base;                // written before `state` publishes them
  uint64_t size;
  uint8_t token[16];
  uint32_t on_gpu;   // 1: `base` is a CUDA device pointer, `gpu` says where
  uint32_t in_file;  // 1: host memory in a shared file, `file` says where
  GpuExport gpu;
  FileExport file;
};

struct alignas(64) PinEntry {
  std::atomic<uint64_t> holder;  // pid << 32 | tid; 0 when free
  std::atomic<uint64_t> target;  // slot_target(); 0 when none
  // The holder's copy, once armed: the addresses, in the holder's process,
  // of its local and remote iovec arrays, `iov_count` entries each (0: not
  // armed).
  std::atomic<uint64_t> local_iov;
  std::atomic<uint64_t> remote_iov;
  std::atomic<uint32_t> iov_count;
  // Set by a releasing owner that cancelled the copy (see above).
  std::atomic<uint32_t> cancelled;
};

// iov_count of an entry whose holder's copy cannot be cancelled (see above).
constexpr uint32_t kUncancellableCopy = UINT32_MAX;

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

constexpr size_t segment_bytes() {
  return sizeof(SegmentHeader) + sizeof(Slot) * kSlots + sizeof(PinEntry) * kPins;
}

// What a pin entry's target holds for (slot, generation); never 0.
inline uint64_t slot_target(uint32_t slot, uint64_t generation) {
  return (generation << 24) | (static_cast<uint64_t>(slot) + 1);
}

// The slot and generation of a target.
inline uint32_t target_slot(uint64_t target) {
  return static_cast<uint32_t>(target & 0xffffff) - 1;
}
inline uint64_t target_generation(uint64_t target) {
  return target >> 24;
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
  // Publishes a buffer (`gpu`: where, when it is in GPU memory; `file`:
  // where, when it lies in a shared file); returns its slot and generation.
  // kResourceExhausted when every slot is in use.
  Result<std::pair<uint32_t, uint64_t>> publish(const void* base, uint64_t size, const Token& token,
                                                const GpuExport* gpu = nullptr,
                                                const FileExport* file = nullptr);
  // How long a reader may stay stopped inside a copy from a buffer being
  // retracted before its copy is cancelled (see the header comment).
  static constexpr std::chrono::milliseconds kStoppedReaderGrace{1000};

  // Retracts the buffer in `slot`; returns once no reader is inside a copy
  // from it, and none can start one (see the header comment).
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
  // entry is busy with live holders. `uncancellable`: the entry is armed as
  // arm_uncancellable() would, in the same step (one check fewer).
  Status acquire(Segment& segment, uint32_t slot, uint64_t generation, bool uncancellable = false);
  // Publishes the copy's iovecs (both arrays of `count` entries, which must
  // stay where they are, in this thread's hands, until reset()) and checks
  // again that the buffer is live. kNotFound when it is not.
  Status arm(const iovec* local, const iovec* remote, size_t count);
  // For a copy nobody can empty from outside (GPU memory, a mapped file):
  // marks the entry kUncancellableCopy and checks again that the buffer is
  // live. kNotFound when it is not.
  Status arm_uncancellable();
  // True once a releasing owner cancelled this copy: its iovecs were
  // emptied, and the op must fail (kNotFound) whatever moved.
  bool armed_uncancellable() const {
    return entry_ && entry_->iov_count.load(std::memory_order_relaxed) == kUncancellableCopy;
  }
  bool cancelled() const {
    return entry_ && entry_->cancelled.load(std::memory_order_acquire) != 0;
  }
  void reset();

 private:
  Segment* segment_ = nullptr;
  uint32_t slot_ = 0;
  uint64_t generation_ = 0;
  PinEntry* entry_ = nullptr;
};

// What became of the thread `holder` (pid << 32 | tid).
enum class HolderState {
  kRunning,  // may be inside a system call
  kStopped,  // stopped or traced: not inside a system call
  kGone,     // exited (or a zombie): never copies again
};
HolderState holder_state(uint64_t holder);

}  // namespace rdmabuf::memory
