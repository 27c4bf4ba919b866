// LocalMemory: a range of this process's memory that rdmabuf reads from or
// writes into, and what keeps it alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "rdmabuf/status.h"

namespace rdmabuf {

enum class MemoryKind : uint8_t {
  kHost = 0,  // ordinary CPU memory
};

// A value type: cheap to copy, does not own the bytes unless `keepalive`
// does. The library holds a copy of `keepalive` for as long as it may touch
// the range (while the memory is registered, or while an op on it is in
// flight), so memory owned by a keepalive can never be freed under a
// transfer. Memory without a keepalive must outlive those uses; the contract
// of Transfer says when the library has stopped touching it.
//
// The keepalive also identifies the memory: backends that register memory
// with a NIC (ibverbs) reuse one registration for every op on memory with
// the same keepalive, while it lives. Memory without one is registered for
// each op and deregistered after it (the library cannot tell when such
// memory is freed and its addresses reused), which is slow for small ops.
class LocalMemory {
 public:
  LocalMemory() = default;
  LocalMemory(void* addr, size_t size, std::shared_ptr<const void> keepalive = {},
              MemoryKind kind = MemoryKind::kHost)
      : addr_(static_cast<std::byte*>(addr)),
        size_(size),
        kind_(kind),
        keepalive_(std::move(keepalive)) {}

  // Views a span of bytes; `keepalive` as above.
  static LocalMemory from_span(std::span<std::byte> bytes,
                               std::shared_ptr<const void> keepalive = {}) {
    return LocalMemory(bytes.data(), bytes.size(), std::move(keepalive));
  }

  // Allocates `size` bytes of page-aligned host memory, zero-filled, owned by
  // the returned value's keepalive (freed when the last copy goes).
  // kInvalidArgument for size 0, kResourceExhausted when allocation fails.
  static Result<LocalMemory> allocate(size_t size);

  std::byte* data() const { return addr_; }
  size_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  const std::shared_ptr<const void>& keepalive() const { return keepalive_; }
  std::span<std::byte> span() const { return {addr_, size_}; }

  // The sub-range [offset, offset + length), sharing the keepalive.
  // kInvalidArgument when it does not fit.
  Result<LocalMemory> slice(size_t offset, size_t length) const;

 private:
  std::byte* addr_ = nullptr;
  size_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
  std::shared_ptr<const void> keepalive_;
};

}  // namespace rdmabuf
