#include "backends/ibverbs/gpu_registration.h"

#include <unistd.h>

#include <algorithm>

#include "common/cuda_driver.h"
#include "common/socket.h"
#include "common/strings.h"

namespace rdmabuf::ibverbs {
namespace {

constexpr size_t kMaxCachedAllocations = 256;

// Through a dma-buf of the pages under [addr, addr + size).
Result<ibv_mr*> register_through_dmabuf(const Device& device, ibv_pd* pd, const LocalMemory& memory,
                                        const std::byte* addr, size_t size, int access) {
  if (!device.lib().reg_dmabuf_mr) {
    return FailedPrecondition("libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than 34)");
  }
  RDMABUF_ASSIGN_OR_RETURN(const cuda::Driver* driver, cuda::Driver::get());
  RDMABUF_RETURN_IF_ERROR(driver->use_device(memory.device()));
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t first = at / page * page;
  const uintptr_t end = (at + size + page - 1) / page * page;
  int fd = -1;
  RDMABUF_RETURN_IF_ERROR(
      driver->check(driver->cuMemGetHandleForAddressRange(
                        &fd, first, end - first, cuda::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                    "the CUDA driver's dma-buf export", StatusCode::kFailedPrecondition));
  Fd dmabuf(fd);  // the registration keeps its own reference
  ibv_mr* mr = device.lib().reg_dmabuf_mr(pd, at - first, size, at, dmabuf.get(), access);
  if (!mr) return FailedPrecondition("ibv_reg_dmabuf_mr: " + errno_text(errno));
  return mr;
}

}  // namespace

Result<std::shared_ptr<MemoryRegion>> register_gpu_range(const Device& device, ibv_pd* pd,
                                                         const LocalMemory& memory,
                                                         const std::byte* addr, size_t size,
                                                         int access) {
  // Relaxed ordering lets PCIe reorder the NIC's writes into GPU memory, as
  // GPUDirect wants; an optional flag, ignored where unsupported.
  access |= IBV_ACCESS_RELAXED_ORDERING;
  auto through_dmabuf = register_through_dmabuf(device, pd, memory, addr, size, access);
  if (through_dmabuf.ok()) return std::make_shared<MemoryRegion>(device.lib(), *through_dmabuf);
  ibv_mr* mr = device.lib().reg_mr(pd, const_cast<std::byte*>(addr), size, access);
  if (mr) return std::make_shared<MemoryRegion>(device.lib(), mr);
  const int err = errno;
  return FailedPrecondition(device.name() + " cannot register " + format_bytes(size) +
                            " of GPU memory: dma-buf: " + through_dmabuf.status().message() +
                            "; plain registration (needs a peer-memory module such as "
                            "nvidia-peermem): ibv_reg_mr: " +
                            errno_text(err));
}

GpuRegistrations::GpuRegistrations(const Device& device, bool windows)
    : device_(device), access_(IBV_ACCESS_LOCAL_WRITE | (windows ? IBV_ACCESS_MW_BIND : 0)) {}

Result<std::shared_ptr<MemoryRegion>> GpuRegistrations::acquire(const LocalMemory& memory) {
  RDMABUF_ASSIGN_OR_RETURN(const cuda::Driver* driver, cuda::Driver::get());
  RDMABUF_ASSIGN_OR_RETURN(cuda::Allocation allocation,
                           driver->allocation_of(memory.data(), memory.size()));
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->base != allocation.base) continue;
    if (it->allocation_id == allocation.id) return it->region;
    entries_.erase(it);  // freed and made again: its registration is stale
    break;
  }
  if (entries_.size() >= kMaxCachedAllocations) entries_.erase(entries_.begin());
  Entry e;
  e.allocation_id = allocation.id;
  e.base = allocation.base;
  e.size = allocation.size;
  e.region = register_gpu_range(device_, device_.pd(), memory,
                                reinterpret_cast<const std::byte*>(allocation.base),
                                allocation.size, access_);
  entries_.push_back(e);
  return e.region;
}

}  // namespace rdmabuf::ibverbs
