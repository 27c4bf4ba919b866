// GPU memory registered with the NIC, so that it reads and writes the GPU's
// memory itself (GPUDirect RDMA): through a dma-buf the CUDA driver exports
// of the memory's pages (ibv_reg_dmabuf_mr), else plainly (ibv_reg_mr, which
// reaches GPU memory only where a peer-memory kernel module such as
// nvidia-peermem is loaded). Where neither works the error names both
// reasons, and the op goes through host memory instead (core/staging.h), or
// the owner does not offer the buffer over ibverbs.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/ibverbs/device.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf::ibverbs {

// Registers [addr, addr + size) of `memory` (on a GPU) with `access`, in
// `pd`. kFailedPrecondition, naming why each way failed, when neither does.
Result<std::shared_ptr<MemoryRegion>> register_gpu_range(const Device& device, ibv_pd* pd,
                                                         const LocalMemory& memory,
                                                         const std::byte* addr, size_t size,
                                                         int access);

// One registration per driver allocation, of the whole of it, so that every
// buffer and tensor in it shares one (PyTorch's caching allocator hands out
// many tensors from one allocation, and needs no expandable segments for
// this). Cached while the allocation lives: the driver's buffer id tells an
// allocation freed and made again at the same address, whose registration
// is then made afresh. A failure is cached the same way, so an op does not
// try again each time. Access: local write, and window binding when
// `windows` (the owner binds type-2 windows over parts of it, remote_access.h).
// Thread-safe.
class GpuRegistrations {
 public:
  GpuRegistrations(const Device& device, bool windows);
  // A registration covering all of `memory`, or why there is none.
  Result<std::shared_ptr<MemoryRegion>> acquire(const LocalMemory& memory);

 private:
  struct Entry {
    uint64_t allocation_id = 0;
    uintptr_t base = 0;
    size_t size = 0;
    Result<std::shared_ptr<MemoryRegion>> region = Internal("unset");
  };
  const Device& device_;
  const int access_;
  std::mutex mu_;
  std::vector<Entry> entries_;  // oldest first
};

}  // namespace rdmabuf::ibverbs
