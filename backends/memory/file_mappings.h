// The memory backend's copies of buffers that lie in a shared file
// (shared_state.h, common/file_backing.h): the reader maps the owner's file
// once per buffer and copies with loads and stores, with no system call.
//
// A mapping covers the pages of the buffer it was made for, no more, and is
// dropped once the owner has released that buffer: sweep() notices, at the
// reader's next copy from that owner, by the owner's count of retractions.
// All of them go once the reader sees that the owner exited (at its next op
// towards it, or when it first reaches another owner), or when the owner's
// view is dropped. A copy holds its
// mapping, so another thread's sweep never unmaps it under the copy.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backends/memory/shared_state.h"
#include "rdmabuf/status.h"

namespace rdmabuf::memory {

// One owner's buffers in shared files, as this reader maps them. Thread-safe.
class FileMappings {
 public:
  explicit FileMappings(pid_t owner) : owner_(owner) {}

  // Where this process reaches byte 0 of the buffer in `slot`, which the
  // caller has pinned at `generation` (in_file); maps the owner's file on
  // first use. `mapping` keeps it mapped: hold it until the copy is done.
  // kNotFound when the owner's file is not what its slot says (or gone),
  // kResourceExhausted when it cannot be mapped.
  struct Address {
    std::byte* base = nullptr;
    std::shared_ptr<const void> mapping;
  };
  Result<Address> address_of(const Slot& slot, uint32_t index, uint64_t generation);

  // Drops the mappings of buffers `segment` no longer holds live; one load
  // when the owner has retracted nothing since the last sweep.
  void sweep(const Segment& segment);

  // Drops every mapping (the owner exited: its buffers' pages are freed
  // once no process maps them). Copies in flight keep theirs until done.
  void clear();

  // How many buffers are mapped now.
  size_t mapped() const;

 private:
  const pid_t owner_;
  std::atomic<uint64_t> seen_retractions_{0};
  mutable std::mutex mu_;
  // slot_target(slot, generation) -> the buffer's mapping. Guarded by mu_.
  std::unordered_map<uint64_t, Address> buffers_;
};

}  // namespace rdmabuf::memory
