// The memory backend's copies of buffers that lie in a shared file
// (shared_state.h, common/file_backing.h): the reader maps the owner's file
// once per buffer and copies with loads and stores, with no system call.
//
// A mapping covers the pages of the buffer it was made for, no more. Once
// the owner has released that buffer (sweep() notices, at the reader's next
// copy from that owner, by the owner's count of retractions), the mapping
// is kept a while among the recently released, up to kIdleBytes and
// kIdleMappings: owners
// register the same memory again and again (an endpoint's receive buffers,
// a pool), and a buffer registered again over the same pages of the same
// file takes the mapping back, with its pages already faulted in, instead
// of mapping anew. The oldest go first beyond the limit. All of them go once
// the reader sees that the owner exited (at its next op towards it, or when
// it first reaches another owner), or when the owner's view is dropped. A
// copy holds its mapping, so another thread's sweep never unmaps it under
// the copy.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backends/memory/shared_state.h"
#include "rdmabuf/status.h"

namespace rdmabuf::memory {

// How often readers mapped an owner's file, and took a mapping back: for
// BackendInfo's details (tests see reuse there).
struct MappingCounters {
  std::atomic<uint64_t> made{0};
  std::atomic<uint64_t> reused{0};
};

// One owner's buffers in shared files, as this reader maps them. Thread-safe.
class FileMappings {
 public:
  // `counters` outlives this.
  FileMappings(pid_t owner, MappingCounters& counters) : owner_(owner), counters_(counters) {}

  // Where this process reaches byte 0 of the buffer in `slot`, which the
  // caller has pinned at `generation` (in_file); maps the owner's file on
  // first use. `mapping` keeps it mapped: hold it until the copy is done.
  // kNotFound when the owner's file is not what its slot says (or gone),
  // kResourceExhausted when it cannot be mapped.
  struct Address {
    std::byte* base = nullptr;
    std::shared_ptr<const void> mapping;
  };
  // A buffer that cannot be mapped is remembered as such (until released):
  // its ops go through the kernel instead, without trying again.
  Result<Address> address_of(const Slot& slot, uint32_t index, uint64_t generation);

  // Drops the mappings of buffers `segment` no longer holds live; one load
  // when the owner has retracted nothing since the last sweep.
  void sweep(const Segment& segment);

  // Drops every mapping (the owner exited: its buffers' pages are freed
  // once no process maps them). Copies in flight keep theirs until done.
  void clear();

 private:
  // The pages of one file that a mapping covers.
  struct Range {
    uint64_t device = 0, inode = 0, first_page = 0, length = 0;
    bool operator==(const Range&) const = default;
  };
  struct Mapped {
    Range range;
    Address address;  // of the range's first page
  };
  // Recently released mappings kept: bytes (whole pages) and mappings at
  // most (each is one of the process's vm.max_map_count).
  static constexpr uint64_t kIdleBytes = 256ull << 20;
  static constexpr size_t kIdleMappings = 256;

  Result<Address> map(const Range& range, const FileExport& file);
  void keep_idle(Mapped mapped);                 // under mu_
  static uint64_t pages_of(const Range& range);  // its length in whole pages

  const pid_t owner_;
  MappingCounters& counters_;
  std::atomic<uint64_t> seen_retractions_{0};
  std::mutex mu_;
  // slot_target(slot, generation) -> its buffer's range and mapping (of the
  // range's first page). Guarded by mu_.
  std::unordered_map<uint64_t, Mapped> buffers_;
  // slot_target()s of buffers that could not be mapped, and why. Guarded by mu_.
  std::unordered_map<uint64_t, Status> unmappable_;
  // Mappings of released buffers, oldest first, and their bytes. Guarded by mu_.
  std::deque<Mapped> idle_;
  uint64_t idle_bytes_ = 0;
};

}  // namespace rdmabuf::memory
