// Where the tool's own host buffers come from: bench's and serve's
// --host-memory. "shared" is LocalMemory::allocate's memory, which a peer
// on this host maps and copies with loads and stores; "private" is
// anonymous memory that no other process can map, which the memory
// transport copies with a system call per range (process_vm_readv /
// process_vm_writev). Measuring both shows what mapping is worth.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf::tool {

enum class HostMemory { kShared, kPrivate };

// "shared" or "private", as --host-memory takes it.
inline const char* host_memory_name(HostMemory how) {
  return how == HostMemory::kPrivate ? "private" : "shared";
}

// The value of --host-memory; kInvalidArgument for anything but "shared"
// or "private".
inline Result<HostMemory> parse_host_memory(std::string_view text) {
  if (text == "shared") return HostMemory::kShared;
  if (text == "private") return HostMemory::kPrivate;
  return InvalidArgument("--host-memory must be shared or private, not '" + std::string(text) +
                         "'");
}

// `size` bytes of page-aligned, zero-filled host memory of the kind `how`
// names, owned by the returned value's keepalive (unmapped when the last
// copy goes). kInvalidArgument for size 0, kResourceExhausted when the
// memory cannot be had.
inline Result<LocalMemory> allocate_host_memory(size_t size, HostMemory how) {
  return how == HostMemory::kShared ? LocalMemory::allocate(size)
                                    : LocalMemory::allocate_private(size);
}

}  // namespace rdmabuf::tool
