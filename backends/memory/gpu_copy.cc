#include "backends/memory/gpu_copy.h"

#include <strings.h>

#include <algorithm>
#include <cstring>

#include "common/strings.h"

namespace rdmabuf::memory {

struct GpuMappings::Allocation {
  const cuda::Driver* driver = nullptr;
  cuda::CUdeviceptr base = 0;
  uint64_t size = 0;  // as mapped here
  int device = 0;
  ~Allocation() {
    if (driver && driver->use_device(device).ok()) driver->cuIpcCloseMemHandle(base);
  }
};

namespace {

// The GPU of this process with PCI bus id `bus` (the owner's GPU), or 0
// when it is not visible here (the mapping then reaches it as a peer).
int device_with_bus_id(const cuda::Driver& driver, const char (&bus)[16]) {
  const std::string wanted(bus, strnlen(bus, sizeof bus));
  for (const cuda::GpuInfo& gpu : driver.gpus()) {
    if (!wanted.empty() && ::strcasecmp(gpu.pci_bus_id.c_str(), wanted.c_str()) == 0) {
      return gpu.ordinal;
    }
  }
  return 0;
}

}  // namespace

Result<GpuMappings::Address> GpuMappings::address_of(const Slot& slot, uint32_t index,
                                                     uint64_t generation) {
  RDMABUF_ASSIGN_OR_RETURN(const cuda::Driver* driver, cuda::Driver::get());
  if (same_process_) {
    return Address{slot.base, device_with_bus_id(*driver, slot.gpu.pci_bus_id), nullptr};
  }
  const uint64_t offset = slot.base - slot.gpu.allocation_base;
  // The owner publishes where its buffer lies; a slot that puts it outside
  // the allocation it names would have this process copy to or from some
  // other GPU memory of its own.
  auto inside = [&](const Allocation& a) -> Result<Address> {
    if (slot.base < slot.gpu.allocation_base || offset > a.size || slot.size > a.size - offset) {
      return ProtocolError("the owner's shared state places a GPU buffer of " +
                           format_bytes(slot.size) + " at offset " + std::to_string(offset) +
                           " of an allocation of " + format_bytes(a.size));
    }
    return Address{a.base + offset, a.device, nullptr};
  };
  std::lock_guard lock(mu_);
  auto known = buffers_.find({index, generation});
  if (known != buffers_.end()) {
    RDMABUF_ASSIGN_OR_RETURN(Address at, inside(*known->second));
    at.mapping = known->second;
    return at;
  }
  const std::string key(slot.gpu.ipc.reserved, sizeof slot.gpu.ipc.reserved);
  std::shared_ptr<Allocation> allocation = allocations_[key].lock();
  if (!allocation) {
    allocation = std::make_shared<Allocation>();
    allocation->driver = driver;
    allocation->device = device_with_bus_id(*driver, slot.gpu.pci_bus_id);
    RDMABUF_RETURN_IF_ERROR(driver->use_device(allocation->device));
    Status opened = driver->check(
        driver->cuIpcOpenMemHandle(&allocation->base, slot.gpu.ipc,
                                   cuda::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
        "cuIpcOpenMemHandle (the GPU memory of process " + std::to_string(owner_) + ")",
        StatusCode::kUnavailable);
    if (!opened.ok()) {
      allocation->driver = nullptr;
      allocations_.erase(key);
      return opened;
    }
    cuda::CUdeviceptr mapped_base = 0;
    size_t mapped_bytes = 0;
    RDMABUF_RETURN_IF_ERROR(
        driver->check(driver->cuMemGetAddressRange(&mapped_base, &mapped_bytes, allocation->base),
                      "cuMemGetAddressRange of an opened IPC mapping"));
    allocation->size = mapped_bytes;
    allocations_[key] = allocation;
  }
  RDMABUF_ASSIGN_OR_RETURN(Address at, inside(*allocation));
  at.mapping = allocation;
  buffers_[{index, generation}] = allocation;
  mapped_.store(buffers_.size(), std::memory_order_relaxed);
  return at;
}

void GpuMappings::sweep(const Segment& segment) {
  if (mapped_.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::shared_ptr<Allocation>> dropped;  // closed outside the lock
  std::lock_guard lock(mu_);
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    const auto [index, generation] = it->first;
    const uint64_t live = generation << 1 | 1;
    if (segment.slot(index).state.load(std::memory_order_acquire) == live) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(it->second));
    it = buffers_.erase(it);
  }
  mapped_.store(buffers_.size(), std::memory_order_relaxed);
  for (auto it = allocations_.begin(); it != allocations_.end();) {
    it = it->second.expired() ? allocations_.erase(it) : std::next(it);
  }
}

Result<GpuExport> export_gpu_memory(const LocalMemory& memory) {
  RDMABUF_ASSIGN_OR_RETURN(const cuda::Driver* driver, cuda::Driver::get());
  RDMABUF_ASSIGN_OR_RETURN(cuda::Allocation allocation,
                           driver->allocation_of(memory.data(), memory.size()));
  RDMABUF_RETURN_IF_ERROR(driver->use_device(memory.device()));
  GpuExport gpu;
  gpu.allocation_base = allocation.base;
  RDMABUF_RETURN_IF_ERROR(driver->check(
      driver->cuIpcGetMemHandle(&gpu.ipc, allocation.base),
      "cuIpcGetMemHandle (memory from cuMemCreate, as PyTorch's expandable segments, has none)",
      StatusCode::kFailedPrecondition));
  const std::string& bus = driver->gpus()[static_cast<size_t>(memory.device())].pci_bus_id;
  std::memcpy(gpu.pci_bus_id, bus.data(), std::min(bus.size(), sizeof gpu.pci_bus_id - 1));
  return gpu;
}

Status copy_gpu_ranges(OpKind kind, std::span<const GpuRange> ranges, int device) {
  RDMABUF_ASSIGN_OR_RETURN(const cuda::Driver* driver, cuda::Driver::get());
  RDMABUF_ASSIGN_OR_RETURN(cuda::CUstream stream, driver->thread_stream(device));
  Status issued;
  for (const GpuRange& r : ranges) {
    const auto local = reinterpret_cast<cuda::CUdeviceptr>(r.local);
    const cuda::CUdeviceptr to = kind == OpKind::kReadIntoLocal ? local : r.remote;
    const cuda::CUdeviceptr from = kind == OpKind::kReadIntoLocal ? r.remote : local;
    issued = driver->check(driver->cuMemcpyAsync(to, from, r.length, stream),
                           "cuMemcpyAsync of " + format_bytes(r.length));
    if (!issued.ok()) break;
  }
  // Whatever was issued finishes before this returns: no copy outlives the pin.
  Status done = driver->check(driver->cuStreamSynchronize(stream), "cuStreamSynchronize");
  return issued.ok() ? done : issued;
}

}  // namespace rdmabuf::memory
