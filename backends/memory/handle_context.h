// The memory backend's context in a handle (docs/wire-format.md, "The
// memory backend's context and shared state"): where the owner's buffer and
// shared state are, and how to reach the owner process.
//
//   u8 version (1) | u8[3] 0 | u32 pid | u64 pid namespace | u32 state fd |
//   u32 slot | u64 generation | u64 buffer address | u64 state address
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "rdmabuf/status.h"

namespace rdmabuf::memory {

constexpr size_t kHandleContextBytes = 48;

struct HandleContext {
  uint32_t pid = 0;              // the owner's pid, in its PID namespace
  uint64_t pid_namespace = 0;    // inode of the owner's /proc/self/ns/pid
  uint32_t state_fd = 0;         // fd number of the owner's shared state (a memfd)
  uint32_t slot = 0;             // the buffer's slot in that state
  uint64_t generation = 0;       // the slot's generation when the buffer was published
  uint64_t base = 0;             // the buffer's address in the owner
  uint64_t segment_address = 0;  // the shared state's address in the owner
};

// The kHandleContextBytes bytes of `context`, format version 1.
std::vector<uint8_t> encode_context(const HandleContext& context);

// Decodes a handle's context data (bytes from any peer). kInvalidArgument
// unless `data` is exactly kHandleContextBytes of version 1 with zero
// reserved bytes, a slot below kSlots and a non-zero pid; so a context that
// decodes re-encodes to the same bytes. Nothing is checked against the
// owner here: a reader does that before it uses the context.
Result<HandleContext> decode_context(std::span<const uint8_t> data);

}  // namespace rdmabuf::memory
