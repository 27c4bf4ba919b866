// Byte patterns the tool serves and checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmabuf::tool {

// Byte i of the buffer holds (i + start) mod 251 (a prime, so that no power
// of two lines up with it).
inline void fill_seq(std::span<std::byte> bytes, uint64_t start) {
  uint32_t v = static_cast<uint32_t>(start % 251);
  for (std::byte& b : bytes) {
    b = static_cast<std::byte>(v);
    if (++v == 251) v = 0;
  }
}

inline void fill_random(std::span<std::byte> bytes, uint64_t seed) {
  uint64_t x = seed | 1;
  for (std::byte& b : bytes) {
    x ^= x << 13;  // xorshift64
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x >> 56);
  }
}

}  // namespace rdmabuf::tool
