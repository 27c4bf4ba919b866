#include <sys/mman.h>

#include <string>

#include "common/strings.h"
#include "common/wire.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/op.h"

namespace rdmabuf {

Result<LocalMemory> LocalMemory::allocate(size_t size) {
  if (size == 0) return InvalidArgument("cannot allocate 0 bytes");
  // mmap gives page-aligned, zero-filled memory and returns it to the kernel
  // on free, whatever its size.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return ResourceExhausted("cannot allocate " + format_bytes(size) + " of host memory");
  }
  std::shared_ptr<const void> owner(
      p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  return LocalMemory(p, size, std::move(owner));
}

Result<LocalMemory> LocalMemory::slice(size_t offset, size_t length) const {
  if (!range_fits(offset, length, size_)) {
    return InvalidArgument("local slice [" + std::to_string(offset) + ", +" +
                           std::to_string(length) + ") does not fit in " + std::to_string(size_) +
                           " B of local memory");
  }
  return LocalMemory(addr_ + offset, length, keepalive_, kind_);
}

const char* op_kind_name(OpKind kind) {
  return kind == OpKind::kReadIntoLocal ? "read" : "write";
}

}  // namespace rdmabuf
