// Deterministic byte patterns for checking that data moved intact and landed
// at the right place. Byte i of pattern `seed` depends on both, and no short
// period repeats, so a read from or a write to the wrong offset (or the
// wrong buffer) is caught. Used by the tests and by rdmabuf_test_peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace rdmabuf::testing {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The 8 pattern bytes at indices [8 * word, 8 * word + 8).
inline uint64_t pattern_word(uint64_t seed, uint64_t word) {
  return splitmix64(word ^ (seed * 0xD1B54A32D192ED03ull));
}

inline uint8_t pattern_byte(uint64_t seed, uint64_t index) {
  return static_cast<uint8_t>(pattern_word(seed, index >> 3) >> (8 * (index & 7)));
}

// out[k] = pattern_byte(seed, start + k).
inline void fill_pattern(std::span<std::byte> out, uint64_t seed, uint64_t start = 0) {
  size_t k = 0;
  while (k < out.size() && ((start + k) & 7) != 0) {
    out[k] = std::byte{pattern_byte(seed, start + k)};
    ++k;
  }
  for (; k + 8 <= out.size(); k += 8) {
    uint64_t w = pattern_word(seed, (start + k) >> 3);
    std::memcpy(out.data() + k, &w, 8);
  }
  for (; k < out.size(); ++k)
    out[k] = std::byte{pattern_byte(seed, start + k)};
}

// The first k where in[k] != pattern_byte(seed, start + k), or nullopt.
inline std::optional<size_t> find_mismatch(std::span<const std::byte> in, uint64_t seed,
                                           uint64_t start = 0) {
  size_t k = 0;
  while (k < in.size() && ((start + k) & 7) != 0) {
    if (in[k] != std::byte{pattern_byte(seed, start + k)}) return k;
    ++k;
  }
  for (; k + 8 <= in.size(); k += 8) {
    uint64_t w = pattern_word(seed, (start + k) >> 3), got;
    std::memcpy(&got, in.data() + k, 8);
    if (got != w) {
      for (size_t j = k; j < k + 8; ++j)
        if (in[j] != std::byte{pattern_byte(seed, start + j)}) return j;
    }
  }
  for (; k < in.size(); ++k)
    if (in[k] != std::byte{pattern_byte(seed, start + k)}) return k;
  return std::nullopt;
}

// How many 8-byte-aligned words (index multiple of 8, relative to the
// pattern) of `in` equal the pattern's word there. A random word matches by
// chance with probability 2^-64, so a non-zero count means bytes of this
// pattern landed.
inline size_t count_pattern_words(std::span<const std::byte> in, uint64_t seed,
                                  uint64_t start = 0) {
  size_t count = 0;
  size_t k = (8 - (start & 7)) & 7;
  for (; k + 8 <= in.size(); k += 8) {
    uint64_t got;
    std::memcpy(&got, in.data() + k, 8);
    if (got == pattern_word(seed, (start + k) >> 3)) ++count;
  }
  return count;
}

// The first k where in[k] != value, or nullopt.
inline std::optional<size_t> find_not(std::span<const std::byte> in, std::byte value) {
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k] != value) return k;
  return std::nullopt;
}

}  // namespace rdmabuf::testing
