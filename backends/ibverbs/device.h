// An RDMA device port opened for rdmabuf: its context, one protection domain,
// the port's attributes and the GID used; and memory registrations on it.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/ibverbs/ibv_lib.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf::ibverbs {

class Device {
 public:
  // Opens `name` (empty: the first device with an active port) and picks
  // the GID: `gid_index` when >= 0, else a RoCE v2 IPv4 GID where there is
  // one, else index 0. The error says why none can be used.
  static Result<std::unique_ptr<Device>> open(const IbvLib& lib, const std::string& name,
                                              int gid_index);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const IbvLib& lib() const { return lib_; }
  const std::string& name() const { return name_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  uint16_t lid() const { return port_attr_.lid; }
  ibv_mtu mtu() const { return port_attr_.active_mtu; }
  bool is_roce() const { return port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  const ibv_device_attr& attr() const { return device_attr_; }
  // Whether the device binds type-2 memory windows to a queue pair (the
  // owner's access control, remote_access.h).
  bool has_windows() const {
    return device_attr_.max_mw > 0 &&
           (device_attr_.device_cap_flags &
            (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
  }

  // "rxe0 port 1 (RoCE, active, MTU 1024), GID[1] ::ffff:10.0.2.15 (RoCE v2)"
  std::string describe() const;

 private:
  Device(const IbvLib& lib) : lib_(lib) {}

  const IbvLib& lib_;
  std::string name_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  int gid_index_ = 0;
  ibv_gid gid_{};
  ibv_port_attr port_attr_{};
  ibv_device_attr device_attr_{};
};

// Every device, port and GID this host has, for `rdmabuf info`; an empty
// list and the reason when there are none.
std::vector<std::string> list_devices(const IbvLib& lib);

// A memory registration, deregistered when the last reference goes.
class MemoryRegion {
 public:
  MemoryRegion(const IbvLib& lib, ibv_mr* mr) : lib_(lib), mr_(mr) {}
  ~MemoryRegion() { lib_.dereg_mr(mr_); }
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  ibv_mr* mr() const { return mr_; }
  const std::byte* begin() const { return static_cast<const std::byte*>(mr_->addr); }
  const std::byte* end() const { return begin() + mr_->length; }

 private:
  const IbvLib& lib_;
  ibv_mr* mr_;
};

// Registers [addr, addr + size) on `device` with `access` flags, in its
// protection domain or in `pd` (one of the device's).
Result<std::shared_ptr<MemoryRegion>> register_range(const Device& device, const void* addr,
                                                     size_t size, int access);
Result<std::shared_ptr<MemoryRegion>> register_range(const Device& device, ibv_pd* pd,
                                                     const void* addr, size_t size, int access);

// Registrations of the reader's local memory, cached while the memory's
// keepalive lives, and for memory without one while it lies in a range
// given to remember_memory(). Other memory without a keepalive is
// registered per use: the library cannot know when it is freed, and a
// registration that outlives its memory would point the NIC at pages that
// now belong to someone else. Thread-safe.
class GpuRegistrations;

class LocalRegistrations {
 public:
  // GPU memory goes to `gpu` (gpu_registration.h).
  LocalRegistrations(const Device& device, GpuRegistrations* gpu) : device_(device), gpu_(gpu) {}
  // A registration covering [addr, addr + size) of `memory`.
  Result<std::shared_ptr<MemoryRegion>> acquire(const LocalMemory& memory, const std::byte* addr,
                                                size_t size);

  // Registrations of host memory made, and uses of a cached one, so far.
  uint64_t made() const { return made_.load(std::memory_order_relaxed); }
  uint64_t reused() const { return reused_.load(std::memory_order_relaxed); }

 private:
  // The cached registration of `memory` (which has a keepalive) that covers
  // [addr, addr + size), registering the whole of `memory` on a miss.
  Result<std::shared_ptr<MemoryRegion>> cached(const LocalMemory& memory, const std::byte* addr,
                                               size_t size);

  struct Entry {
    std::weak_ptr<const void> keepalive;
    std::shared_ptr<MemoryRegion> region;
  };
  const Device& device_;
  GpuRegistrations* const gpu_;
  std::atomic<uint64_t> made_{0};
  std::atomic<uint64_t> reused_{0};
  std::mutex mu_;
  // Guarded by mu_.
  std::vector<Entry> entries_;
  uint64_t seen_forgotten_ = 0;
};

}  // namespace rdmabuf::ibverbs
