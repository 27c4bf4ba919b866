#include "backends/ibverbs/device.h"

#include "backends/ibverbs/gpu_registration.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/remembered_memory.h"
#include "common/socket.h"
#include "common/strings.h"

namespace rdmabuf::ibverbs {
namespace {

constexpr size_t kMaxCachedRegistrations = 256;
// What a reader's local memory is registered for: the NIC writes reads into it.
constexpr int kLocalAccess = IBV_ACCESS_LOCAL_WRITE;

std::string gid_text(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, gid.raw, text, sizeof text);
  return text;
}

bool gid_is_zero(const ibv_gid& gid) {
  for (uint8_t b : gid.raw) {
    if (b != 0) return false;
  }
  return true;
}

bool gid_is_ipv4(const ibv_gid& gid) {
  for (int i = 0; i < 10; ++i) {
    if (gid.raw[i] != 0) return false;
  }
  return gid.raw[10] == 0xff && gid.raw[11] == 0xff;
}

// "RoCE v2", "IB/RoCE v1", or "" where sysfs does not say.
std::string gid_type(const std::string& device, uint8_t port, int index) {
  std::ifstream in("/sys/class/infiniband/" + device + "/ports/" + std::to_string(port) +
                   "/gid_attrs/types/" + std::to_string(index));
  std::string type;
  std::getline(in, type);
  return std::string(trim(type));
}

const char* mtu_text(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return "256";
    case IBV_MTU_512:
      return "512";
    case IBV_MTU_1024:
      return "1024";
    case IBV_MTU_2048:
      return "2048";
    case IBV_MTU_4096:
      return "4096";
  }
  return "?";
}

// The GID rdmabuf uses on a port: a RoCE v2 IPv4 one where there is one,
// then any RoCE v2 one, then the first that is set.
int pick_gid(const IbvLib& lib, ibv_context* ctx, const std::string& device, uint8_t port,
             int table_size) {
  int v2 = -1, any = -1;
  for (int i = 0; i < table_size; ++i) {
    ibv_gid gid{};
    if (lib.query_gid(ctx, port, i, &gid) != 0 || gid_is_zero(gid)) continue;
    bool roce_v2 = gid_type(device, port, i) == "RoCE v2";
    if (roce_v2 && gid_is_ipv4(gid)) return i;
    if (roce_v2 && v2 < 0) v2 = i;
    if (any < 0) any = i;
  }
  return v2 >= 0 ? v2 : std::max(any, 0);
}

}  // namespace

Result<std::unique_ptr<Device>> Device::open(const IbvLib& lib, const std::string& wanted,
                                             int gid_index) {
  int count = 0;
  ibv_device** list = lib.get_device_list(&count);
  if (!list || count == 0) {
    if (list) lib.free_device_list(list);
    return FailedPrecondition("no RDMA devices");
  }
  std::string seen, why;
  std::unique_ptr<Device> chosen;
  for (int i = 0; i < count && !chosen; ++i) {
    std::string name = lib.get_device_name(list[i]);
    seen += (seen.empty() ? "" : ", ") + name;
    if (!wanted.empty() && name != wanted) continue;
    std::unique_ptr<Device> d(new Device(lib));
    d->name_ = name;
    d->context_ = lib.open_device(list[i]);
    if (!d->context_) {
      why += name + ": cannot open (" + errno_text(errno) + "); ";
      continue;
    }
    if (lib.query_device(d->context_, &d->device_attr_) != 0) {
      why += name + ": cannot query; ";
      continue;
    }
    bool active = false;
    for (uint8_t port = 1; port <= d->device_attr_.phys_port_cnt && !active; ++port) {
      ibv_port_attr attr{};
      if (lib.query_port(d->context_, port, &attr) == 0 && attr.state == IBV_PORT_ACTIVE) {
        d->port_ = port;
        d->port_attr_ = attr;
        active = true;
      }
    }
    if (!active) {
      why += name + ": no active port; ";
      continue;
    }
    d->gid_index_ = gid_index >= 0
                        ? gid_index
                        : pick_gid(lib, d->context_, name, d->port_, d->port_attr_.gid_tbl_len);
    if (lib.query_gid(d->context_, d->port_, d->gid_index_, &d->gid_) != 0 ||
        (d->is_roce() && gid_is_zero(d->gid_))) {
      why += name + ": GID index " + std::to_string(d->gid_index_) + " is not usable; ";
      continue;
    }
    d->pd_ = lib.alloc_pd(d->context_);
    if (!d->pd_) {
      why += name + ": cannot allocate a protection domain; ";
      continue;
    }
    chosen = std::move(d);
  }
  lib.free_device_list(list);
  if (chosen) return chosen;
  if (!wanted.empty() && seen.find(wanted) == std::string::npos) {
    return FailedPrecondition("no RDMA device named '" + wanted + "' (found: " + seen + ")");
  }
  return FailedPrecondition("no usable RDMA device: " + why);
}

Device::~Device() {
  if (pd_) lib_.dealloc_pd(pd_);
  if (context_) lib_.close_device(context_);
}

std::string Device::describe() const {
  std::string type = gid_type(name_, port_, gid_index_);
  return name_ + " port " + std::to_string(port_) + " (" + (is_roce() ? "RoCE" : "InfiniBand") +
         ", active, MTU " + mtu_text(mtu()) + "), GID[" + std::to_string(gid_index_) + "] " +
         gid_text(gid_) + (type.empty() ? "" : " (" + type + ")");
}

std::vector<std::string> list_devices(const IbvLib& lib) {
  std::vector<std::string> out;
  int count = 0;
  ibv_device** list = lib.get_device_list(&count);
  for (int i = 0; list && i < count; ++i) {
    std::string name = lib.get_device_name(list[i]);
    ibv_context* ctx = lib.open_device(list[i]);
    if (!ctx) {
      out.push_back(name + ": cannot open");
      continue;
    }
    ibv_device_attr attr{};
    lib.query_device(ctx, &attr);
    for (uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
      ibv_port_attr p{};
      if (lib.query_port(ctx, port, &p) != 0) continue;
      std::string line = name + " port " + std::to_string(port) + ": " +
                         (p.state == IBV_PORT_ACTIVE ? "active" : "not active") + ", " +
                         (p.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand") +
                         ", MTU " + mtu_text(p.active_mtu);
      for (int g = 0; g < p.gid_tbl_len && g < 16; ++g) {
        ibv_gid gid{};
        if (lib.query_gid(ctx, port, g, &gid) != 0 || gid_is_zero(gid)) continue;
        std::string type = gid_type(name, port, g);
        line +=
            "; GID[" + std::to_string(g) + "] " + gid_text(gid) + (type.empty() ? "" : " " + type);
      }
      out.push_back(line);
    }
    lib.close_device(ctx);
  }
  if (list) lib.free_device_list(list);
  return out;
}

Result<std::shared_ptr<MemoryRegion>> register_range(const Device& device, const void* addr,
                                                     size_t size, int access) {
  return register_range(device, device.pd(), addr, size, access);
}

Result<std::shared_ptr<MemoryRegion>> register_range(const Device& device, ibv_pd* pd,
                                                     const void* addr, size_t size, int access) {
  ibv_mr* mr = device.lib().reg_mr(pd, const_cast<void*>(addr), size, access);
  if (!mr) {
    int err = errno;
    return ResourceExhausted("cannot register " + format_bytes(size) + " with " + device.name() +
                             ": " + errno_text(err) +
                             (err == ENOMEM ? " (raise the locked-memory limit, ulimit -l)" : ""));
  }
  return std::make_shared<MemoryRegion>(device.lib(), mr);
}

Result<std::shared_ptr<MemoryRegion>> LocalRegistrations::acquire(const LocalMemory& memory,
                                                                  const std::byte* addr,
                                                                  size_t size) {
  if (memory.on_gpu()) return gpu_->acquire(memory);  // the whole allocation
  if (memory.keepalive()) return cached(memory, addr, size);
  if (auto remembered = remembered_memory_holding(addr, size)) {
    return cached(*remembered, addr, size);
  }
  auto region = register_range(device_, addr, size, kLocalAccess);
  if (region.ok()) made_.fetch_add(1, std::memory_order_relaxed);
  return region;
}

Result<std::shared_ptr<MemoryRegion>> LocalRegistrations::cached(const LocalMemory& memory,
                                                                 const std::byte* addr,
                                                                 size_t size) {
  std::lock_guard lock(mu_);
  const uint64_t forgotten = forgotten_generation();
  if (forgotten != seen_forgotten_) {  // let go of forgotten ranges' pages now
    seen_forgotten_ = forgotten;
    std::erase_if(entries_, [](const Entry& e) { return e.keepalive.expired(); });
  }
  for (const Entry& e : entries_) {
    if (e.region->begin() <= addr && addr + size <= e.region->end() &&
        e.keepalive.lock() == memory.keepalive()) {
      reused_.fetch_add(1, std::memory_order_relaxed);
      return e.region;
    }
  }
  // Forget registrations whose memory may be gone (in-flight uses keep
  // theirs alive through their own reference), and the oldest when full.
  std::erase_if(entries_, [](const Entry& e) { return e.keepalive.expired(); });
  if (entries_.size() >= kMaxCachedRegistrations) entries_.erase(entries_.begin());
  // The whole of `memory`, so that its other slices hit the cache too.
  RDMABUF_ASSIGN_OR_RETURN(auto region,
                           register_range(device_, memory.data(), memory.size(), kLocalAccess));
  made_.fetch_add(1, std::memory_order_relaxed);
  entries_.push_back(Entry{memory.keepalive(), region});
  return region;
}

}  // namespace rdmabuf::ibverbs
