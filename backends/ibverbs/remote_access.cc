#include "backends/ibverbs/remote_access.h"

#include <chrono>
#include <thread>
#include <utility>

#include "common/host.h"
#include "common/socket.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf::ibverbs {
namespace {

// How long a window's bind may take to complete on the owner's side of a
// pair (it is the device's own work: microseconds on a NIC).
constexpr auto kBindLimit = std::chrono::seconds(2);
constexpr uint64_t kBindWrId = 0xb1d;

}  // namespace

struct RemoteAccess::Buffer {
  const std::byte* addr = nullptr;
  size_t size = 0;
  std::shared_ptr<MemoryRegion> region;
  std::mutex mu;  // guards the members below; held across a bind
  bool removed = false;
  std::map<const Grants*, ibv_mw*> windows;  // one per pair granted
};

RemoteAccess::RemoteAccess(const Device& device, GpuRegistrations* gpu)
    : device_(device), gpu_(gpu), windows_(device.has_windows()) {}

RemoteAccess::~RemoteAccess() {
  std::map<uint64_t, std::shared_ptr<Buffer>> left;
  {
    std::lock_guard lock(mu_);
    left.swap(buffers_);
  }
  for (auto& [id, buffer] : left) {
    std::lock_guard lock(buffer->mu);
    for (auto& [grants, mw] : buffer->windows)
      ibv_dealloc_mw(mw);
  }
}

Status RemoteAccess::add(uint64_t id, const LocalMemory& memory) {
  // Without windows, a registration (and so a key) of its own, even when
  // another buffer covers the same range: releasing this buffer must revoke
  // exactly its access, or a stale handle would go on reaching it through
  // its twin's. With windows, the keys are the windows', and GPU memory
  // shares its allocation's registration.
  const int access =
      windows_ ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND
               : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  auto buffer = std::make_shared<Buffer>();
  buffer->addr = memory.data();
  buffer->size = memory.size();
  if (memory.on_gpu() && windows_) {
    RDMABUF_ASSIGN_OR_RETURN(buffer->region, gpu_->acquire(memory));
  } else if (memory.on_gpu()) {
    RDMABUF_ASSIGN_OR_RETURN(
        buffer->region,
        register_gpu_range(device_, device_.pd(), memory, memory.data(), memory.size(), access));
  } else {
    RDMABUF_ASSIGN_OR_RETURN(buffer->region,
                             register_range(device_, memory.data(), memory.size(), access));
  }
  std::lock_guard lock(mu_);
  buffers_[id] = std::move(buffer);
  return Status::Ok();
}

void RemoteAccess::revoke_all(Grants& grants) {
  for (const auto& [id, key] : grants.keys) {
    std::shared_ptr<Buffer> buffer = find(id);
    if (!buffer) continue;  // removed: its windows went with it
    std::lock_guard lock(buffer->mu);
    auto window = buffer->windows.find(&grants);
    if (window == buffer->windows.end()) continue;
    ibv_dealloc_mw(window->second);
    buffer->windows.erase(window);
  }
  grants.keys.clear();
}

void RemoteAccess::remove(uint64_t id) {
  std::shared_ptr<Buffer> buffer;
  {
    std::lock_guard lock(mu_);
    auto it = buffers_.find(id);
    if (it == buffers_.end()) return;
    buffer = std::move(it->second);
    buffers_.erase(it);
  }
  std::lock_guard lock(buffer->mu);  // waits for a bind under way
  buffer->removed = true;
  // Windows first: a registration with windows bound cannot be deregistered.
  for (auto& [grants, mw] : buffer->windows)
    ibv_dealloc_mw(mw);
  buffer->windows.clear();
  buffer->region.reset();  // the last reference: deregistered here
}

std::shared_ptr<RemoteAccess::Buffer> RemoteAccess::find(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = buffers_.find(id);
  return it == buffers_.end() ? nullptr : it->second;
}

Result<uint32_t> RemoteAccess::grant(uint64_t id, QueuePair& qp, Grants& grants) {
  std::shared_ptr<Buffer> buffer = find(id);
  const Status gone = NotFound("buffer " + std::to_string(id) + " is not registered");
  if (!buffer) {
    grants.keys.erase(id);
    return gone;
  }
  std::lock_guard lock(buffer->mu);
  if (buffer->removed) return gone;
  if (!windows_) return grants.keys[id] = buffer->region->rkey();
  auto known = grants.keys.find(id);
  if (known != grants.keys.end() && buffer->windows.contains(&grants)) return known->second;
  RDMABUF_ASSIGN_OR_RETURN(uint32_t key, bind_window(*buffer, qp, grants));
  return grants.keys[id] = key;
}

Result<uint32_t> RemoteAccess::bind_window(Buffer& buffer, QueuePair& qp, const Grants& grants) {
  ibv_mw* mw = ibv_alloc_mw(device_.pd(), IBV_MW_TYPE_2);
  if (!mw) return ResourceExhausted("cannot allocate a memory window: " + errno_text(errno));
  // The same window index with a key byte of chance: a key seen once (and
  // then invalidated) does not name the next window of that index.
  uint8_t byte = 0;
  secure_random(&byte, 1);
  const uint32_t key = (mw->rkey & 0xffffff00u) | byte;
  ibv_send_wr wr{};
  wr.wr_id = kBindWrId;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = key;
  wr.bind_mw.bind_info.mr = buffer.region->mr();
  wr.bind_mw.bind_info.addr = reinterpret_cast<uintptr_t>(buffer.addr);
  wr.bind_mw.bind_info.length = buffer.size;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp.qp(), &wr, &bad); rc != 0) {
    ibv_dealloc_mw(mw);
    return Unavailable("cannot bind a memory window: " + errno_text(rc));
  }
  const auto until = Clock::now() + kBindLimit;
  ibv_wc wc{};
  int n = 0;
  while ((n = ibv_poll_cq(qp.cq(), 1, &wc)) == 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  if (n == 0) {
    // Never bound in time: the pair goes to error, which flushes the bind,
    // before the window is let go.
    qp.to_error().ignore();
    const auto flush_until = Clock::now() + kBindLimit;
    while ((n = ibv_poll_cq(qp.cq(), 1, &wc)) == 0 && Clock::now() < flush_until)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (n != 1 || wc.status != IBV_WC_SUCCESS) {
    ibv_dealloc_mw(mw);
    return Unavailable(std::string("cannot bind a memory window: ") +
                       (n == 1 ? device_.lib().wc_status_str(wc.status) : "no completion"));
  }
  buffer.windows[&grants] = mw;
  return key;
}

}  // namespace rdmabuf::ibverbs
