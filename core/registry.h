// The buffers a manager has minted: id -> memory, token, and the pins that
// peers' accesses hold while they touch the memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "rdmabuf/backend.h"

namespace rdmabuf {

class Registry final : public BufferResolver {
 public:
  // How long release() waits for in-flight accesses before aborting them.
  static constexpr std::chrono::milliseconds kReleaseGrace{1000};

  // Adds buffer `id`. The caller picks ids that are never reused.
  void add(uint64_t id, const Token& token, LocalMemory memory);

  // Removes buffer `id`: new pins fail with kNotFound at once; returns when
  // every pin is gone (aborting, after kReleaseGrace, the holders that gave
  // a PinAbort). kNotFound when `id` is not registered.
  //
  // Returns the buffer's memory, keepalive included: the registry lets go of
  // it, the caller must hold it until every backend has stopped serving the
  // buffer (Backend::unregister_memory returned), then drop it. Dropping it
  // first would free memory that a NIC or a same-host reader may still
  // reach.
  Result<LocalMemory> release(uint64_t id);

  // Every registered id (for shutdown).
  std::vector<uint64_t> ids() const;
  size_t size() const;

  Result<PinnedRegion> pin(uint64_t id, const Token& token, PinAbort* abort) override;

 private:
  struct Entry;
  static void unpin(void* entry, PinAbort* abort);

  mutable std::shared_mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> entries_;
};

}  // namespace rdmabuf
