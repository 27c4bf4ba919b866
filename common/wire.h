// Little-endian encoding with bounds checks, for every byte rdmabuf puts on
// the wire or into a handle. A Reader never reads past its input: a short or
// malformed input turns into a failed read (ok() false), never a crash.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "rdmabuf/status.h"

static_assert(std::endian::native == std::endian::little,
              "rdmabuf's wire format is little-endian and so far only little-endian hosts "
              "are supported");

namespace rdmabuf {

// Appends fixed-width little-endian fields to a byte buffer: a vector, or
// any type with its size(), resize() and data().
template <typename Bytes>
class BasicWireWriter {
 public:
  explicit BasicWireWriter(Bytes& out) : out_(out) {}
  // Inline always: a frame's fields are a handful of these on every
  // message's path.
  template <typename T>
  [[gnu::always_inline]] void put(T value) {
    static_assert(std::is_integral_v<T>);
    size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  void bytes(const void* data, size_t size) {
    if (size == 0) return;
    size_t at = out_.size();
    out_.resize(at + size);
    std::memcpy(out_.data() + at, data, size);
  }
  // A u8 length followed by the bytes; `text` must be < 256 bytes.
  void short_string(std::string_view text) {
    put<uint8_t>(static_cast<uint8_t>(text.size()));
    bytes(text.data(), text.size());
  }

 private:
  Bytes& out_;
};
using WireWriter = BasicWireWriter<std::vector<uint8_t>>;

// Reads fixed-width little-endian fields; every read checks the bounds.
class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> in) : in_(in) {}
  bool ok() const { return ok_; }
  size_t remaining() const { return in_.size() - pos_; }
  size_t position() const { return pos_; }

  template <typename T>
  T get() {
    static_assert(std::is_integral_v<T>);
    T value{};
    if (!take(sizeof(T))) return value;
    std::memcpy(&value, in_.data() + pos_ - sizeof(T), sizeof(T));
    return value;
  }
  bool bytes(void* out, size_t size) {
    if (!take(size)) return false;
    std::memcpy(out, in_.data() + pos_ - size, size);
    return true;
  }
  std::span<const uint8_t> view(size_t size) {
    if (!take(size)) return {};
    return in_.subspan(pos_ - size, size);
  }
  std::string short_string() {
    size_t size = get<uint8_t>();
    auto v = view(size);
    return std::string(v.begin(), v.end());
  }

 private:
  bool take(size_t size) {
    if (!ok_ || size > remaining()) {
      ok_ = false;
      return false;
    }
    pos_ += size;
    return true;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// True when [offset, offset + length) lies within [0, size), without
// overflowing for any inputs.
inline bool range_fits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace rdmabuf
