// The copy of a received message's bytes into its receive: out of the
// endpoint's shared-memory ring (memory another core wrote a moment ago,
// which each load fetches from that core's cache) or its connection's
// buffer.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "common/sanitizers.h"

namespace rdmabuf {

// Whether this CPU says its string move (`rep movsb`) is fast from the
// first bytes on (FSRM: CPUID leaf 7, EDX bit 4). Read once, at load.
extern const bool kShortStringMoveIsFast;

// Copies `size` bytes from `from` to `to` (not overlapping), as memcpy,
// with a copy of up to 32 bytes inline: two overlapping loads and stores
// of one width each. A frame's header and fields, a credit and a small
// message are such copies, three of them on every small send through the
// shared rings, where a call to memcpy (about 20 instructions with its
// choice by size) costs more than the copy.
[[gnu::always_inline]] inline void copy_short(void* to, const void* from, size_t size) {
  auto* out = static_cast<unsigned char*>(to);
  const auto* in = static_cast<const unsigned char*>(from);
  // The first and the last `width` bytes, which together cover all of
  // them for sizes from `width` to twice it.
  auto ends = [&](auto width_constant) {
    constexpr size_t width = decltype(width_constant)::value;
    unsigned char first[width], last[width];
    std::memcpy(first, in, width);
    std::memcpy(last, in + size - width, width);
    std::memcpy(out, first, width);
    std::memcpy(out + size - width, last, width);
  };
  if (size > 32) {
    std::memcpy(out, in, size);
  } else if (size >= 16) {
    ends(std::integral_constant<size_t, 16>());
  } else if (size >= 8) {
    ends(std::integral_constant<size_t, 8>());
  } else if (size >= 4) {
    ends(std::integral_constant<size_t, 4>());
  } else if (size > 0) {  // 1 to 3: the first, middle and last byte
    out[0] = in[0];
    out[size / 2] = in[size / 2];
    out[size - 1] = in[size - 1];
  }
}

// Copies `size` bytes from `from` to `to` (not overlapping), as memcpy.
//
// Up to 32 bytes, copy_short's inline copy. From 1 KiB on, on x86-64
// (LP64: rdi, rsi and rcx whole) where the CPU says short string moves
// are fast, with the string move (`rep movsb`) inline. glibc's memcpy
// takes the string move too above 2112 bytes on this project's host, but
// behind its checks and a call; a receiver streaming 4 KiB messages
// through the ring took 2-4% more a second with the inline one, in
// interleaved runs. Elsewhere
// memcpy, whose thresholds glibc tunes to the CPU: an emulated CPU (the
// Soft-RoCE VM's) moved 4 KiB in 11.1 us by string move against 1.6 us by
// memcpy. Between the two, memcpy: the string move's start-up costs more
// than a small copy. Under a sanitizer, no string move: the sanitizers
// do not see into assembly (copy_short's copies are plain C++, which they
// see). `string_move`: whether to use it (tests take both ways).
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
  copy_short(to, from, size);
}

}  // namespace rdmabuf
