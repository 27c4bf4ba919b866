// The copy of a received message's bytes into its receive: out of the
// endpoint's shared-memory ring (memory another core wrote a moment ago,
// which each load fetches from that core's cache) or its connection's
// buffer.
#pragma once

#include <cstddef>
#include <cstring>

#include "common/sanitizers.h"

namespace rdmabuf {

// Copies `size` bytes from `from` to `to` (not overlapping), as memcpy.
//
// From 1 KiB on, on x86-64 (LP64: rdi, rsi and rcx whole), with the CPU's
// string move (`rep movsb`) inline.
// glibc's memcpy takes the string move too above 2112 bytes here, but
// behind its checks and a call; a receiver streaming 4 KiB messages through
// the ring took 2-4% more a second with the inline one, in interleaved runs
// (docs/performance.md, fourteenth session). Below 1 KiB, memcpy: the
// string move's start-up costs more than a small copy. Under a sanitizer,
// memcpy always: the sanitizers do not see into assembly.
inline void copy_received(void* to, const void* from, size_t size) {
#if defined(__x86_64__) && defined(__LP64__) && !defined(RDMABUF_UNDER_SANITIZER)
  constexpr size_t kStringMoveFrom = 1024;
  if (size >= kStringMoveFrom) {
    asm volatile("rep movsb" : "+D"(to), "+S"(from), "+c"(size) : : "memory");
    return;
  }
#endif
  std::memcpy(to, from, size);
}

}  // namespace rdmabuf
