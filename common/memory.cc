#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>

#include "common/cuda_driver.h"
#include "common/file_backing.h"
#include "common/shared_file.h"
#include "common/strings.h"
#include "common/wire.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/op.h"

namespace rdmabuf {

namespace {

// Whether descriptor `fd` lies in the upper half of what RLIMIT_NOFILE
// allows: allocations then stop taking descriptors (their memory is
// private instead), so that sockets, eventfds and pidfds still find some.
bool in_upper_half_of_descriptors(int fd) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return false;
  return static_cast<rlim_t>(fd) >= limit.rlim_cur / 2;
}

}  // namespace

Result<LocalMemory> LocalMemory::allocate(size_t size) {
  if (size == 0) return InvalidArgument("cannot allocate 0 bytes");
  // In a memfd of its own, sealed at its size, so that a reader on this
  // host can map it and copy with loads and stores (common/file_backing.h);
  // mmap gives page-aligned, zero-filled memory and returns it to the
  // kernel on free, whatever its size. Anonymous memory where the kernel
  // refuses a memfd, or once the process holds half the descriptors it may.
  auto file = create_sealed_memfd("rdmabuf", size, "an allocation");
  if (file.ok() && !in_upper_half_of_descriptors(file->get())) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file->get(), 0);
    if (p != MAP_FAILED) {
      const int fd = file->release();
      note_allocation(p, size, fd);
      std::shared_ptr<const void> owner(p, [size, fd](const void* q) {
        forget_allocation(q);
        ::munmap(const_cast<void*>(q), size);
        ::close(fd);
      });
      return LocalMemory(p, size, std::move(owner));
    }
  }
  return allocate_private(size);
}

Result<LocalMemory> LocalMemory::allocate_private(size_t size) {
  if (size == 0) return InvalidArgument("cannot allocate 0 bytes");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return ResourceExhausted("cannot allocate " + format_bytes(size) + " of host memory");
  }
  std::shared_ptr<const void> owner(
      p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  return LocalMemory(p, size, std::move(owner));
}

const char* memory_kind_name(MemoryKind kind) {
  return kind == MemoryKind::kCuda ? "cuda" : "host";
}

Result<LocalMemory> LocalMemory::recognize(void* addr, size_t size,
                                           std::shared_ptr<const void> keepalive) {
  // A device pointer exists only where the driver is loaded already; a
  // process without one is not made to load it (cuInit takes a while).
  auto driver = cuda::Driver::get_if_loaded();
  if (!driver.ok()) return LocalMemory(addr, size, std::move(keepalive));
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;
  RDMABUF_RETURN_IF_ERROR((*driver)->kind_of(addr, kind, device));
  if (kind == MemoryKind::kCuda && size > 0) {
    RDMABUF_RETURN_IF_ERROR((*driver)->allocation_of(addr, size).status());
  }
  return LocalMemory(addr, size, std::move(keepalive), kind, device);
}

Result<LocalMemory> LocalMemory::allocate_gpu(size_t size, int device) {
  if (size == 0) return InvalidArgument("cannot allocate 0 bytes");
  RDMABUF_ASSIGN_OR_RETURN(const cuda::Driver* driver, cuda::Driver::get());
  RDMABUF_RETURN_IF_ERROR(driver->use_device(device));
  cuda::CUdeviceptr p = 0;
  const cuda::CUresult r = driver->cuMemAlloc(&p, size);
  if (r == cuda::CUDA_ERROR_OUT_OF_MEMORY) {
    return ResourceExhausted("cannot allocate " + format_bytes(size) + " on GPU " +
                             std::to_string(device));
  }
  RDMABUF_RETURN_IF_ERROR(driver->check(r, "cuMemAlloc of " + format_bytes(size)));
  std::shared_ptr<const void> owner(reinterpret_cast<void*>(p), [driver, device](const void* q) {
    if (driver->use_device(device).ok()) {
      driver->cuMemFree(reinterpret_cast<cuda::CUdeviceptr>(q));
    }
  });
  return LocalMemory(reinterpret_cast<void*>(p), size, std::move(owner), MemoryKind::kCuda, device);
}

Result<LocalMemory> LocalMemory::slice(size_t offset, size_t length) const {
  if (!range_fits(offset, length, size_)) {
    return InvalidArgument("local slice [" + std::to_string(offset) + ", +" +
                           std::to_string(length) + ") does not fit in " + std::to_string(size_) +
                           " B of local memory");
  }
  return LocalMemory(addr_ + offset, length, keepalive_, kind_, device_);
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kReadIntoLocal:
      return "read";
    case OpKind::kWriteFromLocal:
      return "write";
    case OpKind::kFetchAdd:
      return "fetch-add";
    case OpKind::kCompareAndSwap:
      return "compare-and-swap";
  }
  return "unknown op";
}

}  // namespace rdmabuf
