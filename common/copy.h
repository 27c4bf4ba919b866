// The copy of a received message's bytes into its receive: out of the
// endpoint's shared-memory ring (memory another core wrote a moment ago,
// which each load fetches from that core's cache) or its connection's
// buffer.
#pragma once

#include <cstddef>
#include <cstring>

#include "common/sanitizers.h"

namespace rdmabuf {

// Whether this CPU says its string move (`rep movsb`) is fast from the
// first bytes on (FSRM: CPUID leaf 7, EDX bit 4). Read once, at load.
extern const bool kShortStringMoveIsFast;

// Copies `size` bytes from `from` to `to` (not overlapping), as memcpy.
//
// From 1 KiB on, on x86-64 (LP64: rdi, rsi and rcx whole) where the CPU
// says short string moves are fast, with the string move (`rep movsb`)
// inline. glibc's memcpy takes the string move too above 2112 bytes on
// this project's host, but behind its checks and a call; a receiver
// streaming 4 KiB messages through the ring took 2-4% more a second with
// the inline one, in interleaved runs (docs/performance.md, fourteenth
// session). Elsewhere memcpy, whose thresholds glibc tunes to the CPU: an
// emulated CPU (the Soft-RoCE VM's) moved 4 KiB in 11.1 us by string move
// against 1.6 us by memcpy. Below 1 KiB, memcpy: the string move's
// start-up costs more than a small copy. Under a sanitizer, memcpy always:
// the sanitizers do not see into assembly. `string_move`: whether to use
// it (tests take both ways).
inline void copy_received(void* to, const void* from, size_t size,
                          bool string_move = kShortStringMoveIsFast) {
#if defined(__x86_64__) && defined(__LP64__) && !defined(RDMABUF_UNDER_SANITIZER)
  constexpr size_t kStringMoveFrom = 1024;
  if (string_move && size >= kStringMoveFrom) {
    asm volatile("rep movsb" : "+D"(to), "+S"(from), "+c"(size) : : "memory");
    return;
  }
#else
  (void)string_move;
#endif
  std::memcpy(to, from, size);
}

}  // namespace rdmabuf
