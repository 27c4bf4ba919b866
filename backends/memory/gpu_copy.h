// The memory backend's copies of buffers in GPU memory (shared_state.h):
// GPU to GPU, and GPU to or from host memory, one-sided, by the reader's
// CUDA driver.
//
// An owner in another process publishes its buffer's allocation as a CUDA
// IPC handle; the reader opens it once and keeps it (one mapping per
// allocation, shared by every buffer in it), and closes it once no live
// buffer of that owner lies in it any more: sweep() notices released
// buffers, at the reader's next GPU copy from that owner, and the mappings
// all close when the owner's view is dropped. An owner in this process is
// reached at its own device pointers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "backends/memory/shared_state.h"
#include "common/cuda_driver.h"
#include "rdmabuf/op.h"
#include "rdmabuf/status.h"

namespace rdmabuf::memory {

// Owner: what readers need to reach `memory` (on a GPU): its allocation's
// IPC handle. kFailedPrecondition when the driver gives none.
Result<GpuExport> export_gpu_memory(const LocalMemory& memory);

// One owner's GPU allocations, as this reader maps them. Thread-safe.
class GpuMappings {
 public:
  GpuMappings(pid_t owner, bool same_process) : owner_(owner), same_process_(same_process) {}

  // Where this process reaches byte 0 of the buffer in `slot` (which the
  // caller has pinned at `generation`, on_gpu), and the GPU whose context
  // to copy with. `mapping` keeps the IPC mapping open: hold it until the
  // copy has finished, since another thread's sweep() may drop the
  // buffer's entry (once the owner marks it released) meanwhile.
  // kProtocolError when the slot puts the buffer outside its allocation.
  struct Address {
    uint64_t base = 0;
    int device = 0;
    std::shared_ptr<const void> mapping;  // null in the owner's own process
  };
  Result<Address> address_of(const Slot& slot, uint32_t index, uint64_t generation);

  // Drops the mappings of buffers `segment` no longer holds live (closing
  // an allocation's once no live buffer uses it). Cheap when there are none.
  void sweep(const Segment& segment);

 private:
  struct Allocation;  // an opened IPC handle; closed when the last user goes

  const pid_t owner_;
  const bool same_process_;
  std::atomic<size_t> mapped_{0};  // buffers_.size(), read without the lock
  std::mutex mu_;
  // (slot, generation) -> the mapping of its allocation.
  std::map<std::pair<uint32_t, uint64_t>, std::shared_ptr<Allocation>> buffers_;
  // IPC handle bytes -> the allocation, while some buffer uses it.
  std::map<std::string, std::weak_ptr<Allocation>> allocations_;
};

// Copies the ranges of `ops` (pairs of local and remote addresses of
// `lengths` bytes, the remote ones in this process's view) on this thread's
// stream of GPU `device`, finished on return.
struct GpuRange {
  std::byte* local;
  uint64_t remote;
  uint64_t length;
};
Status copy_gpu_ranges(OpKind kind, std::span<const GpuRange> ranges, int device);

}  // namespace rdmabuf::memory
