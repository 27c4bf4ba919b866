// The ranges given to remember_memory() (rdmabuf/memory.h), for backends
// that register readers' memory with a NIC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "rdmabuf/memory.h"

namespace rdmabuf {

// The remembered range that holds all of [addr, addr + size), as host
// memory whose keepalive identifies the range (it owns nothing, and
// forget_memory drops the last reference the table holds); nullopt when no
// remembered range holds it.
std::optional<LocalMemory> remembered_memory_holding(const std::byte* addr, size_t size);

// Counts the forget_memory() calls that forgot something: a cache of
// registrations that sees it change sweeps the entries of forgotten ranges.
uint64_t forgotten_generation();

}  // namespace rdmabuf
