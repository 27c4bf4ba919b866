// The owner's side of remote access over ibverbs: each registered buffer's
// memory registration, and the access granted to readers' queue pairs.
//
// Where the device has type-2 memory windows (Device::has_windows()), a
// buffer is registered for local access and window binding only, so that
// its registration's key reaches nothing from the network. A reader that
// presents the buffer's handle on its queue pair (handshake.h) gets a
// window bound to the owner's side of that pair alone, with a key of its
// own (its key byte random): no other queue pair, of that reader or of any
// other, can use it, and no key of another buffer works on that pair unless
// its handle was presented there too. Releasing the buffer invalidates
// every window on it, then deregisters it.
//
// Where the device has no such windows, the registration itself allows
// remote read and write, and a reader learns its key only by presenting
// the handle; but the key is the device's, good on any queue pair of the
// owner's protection domain: a reader that holds some handle of this owner
// (so has a queue pair) and guesses another buffer's key reaches that
// buffer (docs/security.md).
//
// Thread-safe: add() and remove() run on the manager's callers' threads,
// grant() and revoke_all() on a responder's own thread, the only one that
// posts to its queue pair's send queue.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backends/ibverbs/device.h"
#include "backends/ibverbs/gpu_registration.h"
#include "backends/ibverbs/queue_pair.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf::ibverbs {

// The access one responder's queue pair was granted, by buffer id: the
// keys it was given. Owned by that responder; RemoteAccess fills it.
struct Grants {
  std::unordered_map<uint64_t, uint32_t> keys;
};

class RemoteAccess {
 public:
  // GPU memory's registrations come from `gpu` where windows guard it.
  RemoteAccess(const Device& device, GpuRegistrations* gpu);
  ~RemoteAccess();
  RemoteAccess(const RemoteAccess&) = delete;
  RemoteAccess& operator=(const RemoteAccess&) = delete;

  // Whether grants are memory windows bound to one queue pair (see above).
  bool windows() const { return windows_; }

  // Registers buffer `id`'s memory. kResourceExhausted when the device
  // refuses; for GPU memory, kFailedPrecondition saying why (the buffer is
  // then not offered over ibverbs). With windows, GPU memory shares its
  // allocation's registration (access is the windows'); without, it gets
  // one of its own, as host memory does.
  Status add(uint64_t id, const LocalMemory& memory);
  // Invalidates every window on buffer `id`, then deregisters it: from its
  // return no queue pair reaches the memory. Unknown ids are ignored.
  void remove(uint64_t id);

  // Opens buffer `id` to `qp`, the owner's side of one reader's pair, and
  // records the key in `grants`; the key the pair was granted before, if
  // any. kNotFound when the buffer is not (or no longer) registered;
  // kUnavailable when the window cannot be bound (the pair failed).
  Result<uint32_t> grant(uint64_t id, QueuePair& qp, Grants& grants);
  // Invalidates every window in `grants` (the pair is going).
  void revoke_all(Grants& grants);

 private:
  struct Buffer;
  std::shared_ptr<Buffer> find(uint64_t id);
  // A window over `buffer` bound to `qp`, recorded as `grants`'s: its key.
  // Called with buffer.mu held.
  Result<uint32_t> bind_window(Buffer& buffer, QueuePair& qp, const Grants& grants);

  const Device& device_;
  GpuRegistrations* const gpu_;
  const bool windows_;
  std::mutex mu_;  // guards buffers_ (each Buffer has a lock of its own)
  std::map<uint64_t, std::shared_ptr<Buffer>> buffers_;
};

}  // namespace rdmabuf::ibverbs
