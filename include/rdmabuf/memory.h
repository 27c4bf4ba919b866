// LocalMemory: a range of this process's memory that rdmabuf reads from or
// writes into, and what keeps it alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "rdmabuf/status.h"

namespace rdmabuf {

enum class MemoryKind : uint8_t {
  kHost = 0,  // ordinary CPU memory
  kCuda = 1,  // memory of an NVIDIA GPU (a CUDA device pointer), with its ordinal
};

// "host" or "cuda".
const char* memory_kind_name(MemoryKind kind);

// A value type: cheap to copy, does not own the bytes unless `keepalive`
// does. The library holds a copy of `keepalive` for as long as it may touch
// the range (while the memory is registered, or while an op on it is in
// flight), so memory owned by a keepalive can never be freed under a
// transfer. Memory without a keepalive must outlive those uses; the contract
// of Transfer says when the library has stopped touching it.
//
// The keepalive also identifies the memory: backends that register memory
// with a NIC (ibverbs) reuse one registration for every op on memory with
// the same keepalive, while it lives. A keepalive need not own the bytes to
// do that: any object whose life ends no later than the memory stays mapped
// at this address works as the identity (the Python package uses one per
// tensor or array storage). Memory without a keepalive is registered for
// each op and deregistered after it, since the library cannot see when it
// is freed and its addresses reused, unless it lies in a range given to
// remember_memory() (below).
//
// GPU memory: `recognize` asks the CUDA driver where a pointer lives, so a
// device pointer (a CUDA tensor's data_ptr) becomes kCuda memory of its GPU
// without the caller saying so. The driver is loaded at run time; where
// there is none, GPU memory is kFailedPrecondition and host memory works as
// ever. Every transport takes GPU memory on either side (docs/gpu.md).
class LocalMemory {
 public:
  LocalMemory() = default;
  // `kind` and `device` as given, unchecked: use recognize() for memory
  // whose kind the caller does not know.
  LocalMemory(void* addr, size_t size, std::shared_ptr<const void> keepalive = {},
              MemoryKind kind = MemoryKind::kHost, int device = 0)
      : addr_(static_cast<std::byte*>(addr)),
        size_(size),
        kind_(kind),
        device_(kind == MemoryKind::kCuda ? device : 0),
        keepalive_(std::move(keepalive)) {}

  // The memory at [addr, addr + size), with the kind and GPU the CUDA
  // driver's pointer attributes give it: kCuda for device memory, kHost for
  // any other (host memory, pinned or not, and memory the driver does not
  // know, or when there is no driver). kInvalidArgument when GPU memory
  // runs past the driver allocation that holds `addr`.
  static Result<LocalMemory> recognize(void* addr, size_t size,
                                       std::shared_ptr<const void> keepalive = {});

  // Views a span of bytes; `keepalive` as above.
  static LocalMemory from_span(std::span<std::byte> bytes,
                               std::shared_ptr<const void> keepalive = {}) {
    return LocalMemory(bytes.data(), bytes.size(), std::move(keepalive));
  }

  // Allocates `size` bytes of page-aligned host memory, zero-filled, owned by
  // the returned value's keepalive (freed when the last copy goes).
  // kInvalidArgument for size 0, kResourceExhausted when allocation fails.
  //
  // The memory lies in a file of its own (a memfd, sealed at its size), so
  // that readers and writers on this host map it and copy with plain loads
  // and stores, at memory speed, rather than through a system call per op
  // (docs/performance.md). Like any MAP_SHARED memory it stays shared with
  // a child after fork(), not copied on write. It holds one file descriptor
  // while it lives; once the process holds half the descriptors its
  // RLIMIT_NOFILE allows, or where the kernel refuses a memfd, the memory is
  // private, as allocate_private()'s. Memory the
  // caller maps from a shared file itself (a memfd, /dev/shm, a torch
  // tensor after share_memory_()) is reached the same way.
  static Result<LocalMemory> allocate(size_t size);
  // As allocate(), in anonymous memory private to this process: a child
  // after fork() gets a copy on write, and same-host peers reach it through
  // the kernel (a system call per op) instead of a mapping.
  static Result<LocalMemory> allocate_private(size_t size);
  // Allocates `size` bytes of memory on GPU `device` (cuMemAlloc), owned by
  // the returned value's keepalive, contents undefined. kFailedPrecondition
  // without a CUDA driver or GPU (the message says which), kInvalidArgument
  // for size 0 or no such GPU, kResourceExhausted when the GPU is full.
  static Result<LocalMemory> allocate_gpu(size_t size, int device = 0);

  std::byte* data() const { return addr_; }
  size_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  bool on_gpu() const { return kind_ == MemoryKind::kCuda; }
  // The GPU's ordinal (CUDA's numbering in this process) for kCuda; 0 for host.
  int device() const { return device_; }
  const std::shared_ptr<const void>& keepalive() const { return keepalive_; }
  // The bytes, for host memory only: the CPU cannot touch GPU memory.
  std::span<std::byte> span() const { return {addr_, size_}; }

  // The sub-range [offset, offset + length), sharing the keepalive.
  // kInvalidArgument when it does not fit.
  Result<LocalMemory> slice(size_t offset, size_t length) const;

 private:
  std::byte* addr_ = nullptr;
  size_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
  int device_ = 0;
  std::shared_ptr<const void> keepalive_;
};

// Memory without a keepalive that stays mapped for a while (an arena, a
// pool, a cache of pages): after remember_memory(addr, size), ops on any
// part of [addr, addr + size) reuse one NIC registration of the whole range
// (per device) instead of registering and deregistering for each op.
//
// The caller promises that the range stays mapped, at this address, with
// the same pages, until forget_memory() covers it: call forget_memory before
// freeing, unmapping or remapping the memory (a registration pins the pages
// it was made for, so one used after the memory was unmapped and mapped
// again would move the old pages, not the new). After forget_memory returns,
// no op that starts later uses a registration made for the range; ops in
// flight keep theirs until they complete, as for any memory without a
// keepalive (Transfer says when the library stops touching it).
//
// kInvalidArgument for a null or empty range, or one that overlaps a range
// remembered already (forget it first). Process-wide and thread-safe; costs
// nothing where no backend registers memory (tcp, memory).
Status remember_memory(const void* addr, size_t size);
// Forgets every remembered range that overlaps [addr, addr + size) (size 0:
// the range that holds addr); returns how many. Their registrations are released at the next op or,
// at the latest, when the manager stops.
size_t forget_memory(const void* addr, size_t size);

}  // namespace rdmabuf
