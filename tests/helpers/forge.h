// Editing a handle's bytes the way an attacker or a corrupted channel
// would, and resealing it (total length and CRC-32C) so that it decodes:
// the tests use this to hand the owner forged handles that only the owner
// can refuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmabuf/buffer.h"

namespace rdmabuf::testing {

// Byte offsets of the fixed fields of handle format version 1
// (common/buffer.cc).
namespace handle_layout {
constexpr size_t kMagic = 0;
constexpr size_t kVersion = 4;
constexpr size_t kFlags = 5;
constexpr size_t kTotalLength = 6;
constexpr size_t kId = 8;
constexpr size_t kToken = 16;
constexpr size_t kRegionSize = 32;
constexpr size_t kOffset = 40;
constexpr size_t kLength = 48;
constexpr size_t kManagerId = 56;
constexpr size_t kPid = 64;
constexpr size_t kAddress = 68;  // u8 length, then the bytes
}  // namespace handle_layout

template <typename T>
void poke(std::vector<uint8_t>& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof value);
}
template <typename T>
T peek(const std::vector<uint8_t>& bytes, size_t at) {
  T value{};
  std::memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}

// Rewrites the total-length field and the trailing CRC-32C to match `bytes`.
void reseal(std::vector<uint8_t>& bytes);

// `handle` with its token's byte `index` XOR `mask`, resealed.
Result<RemoteBuffer> with_altered_token(const RemoteBuffer& handle, size_t index = 0,
                                        uint8_t mask = 0x01);
// `handle` claiming a buffer of `region_size` bytes and the view
// [offset, offset + length) of it, resealed.
Result<RemoteBuffer> with_view(const RemoteBuffer& handle, uint64_t region_size, uint64_t offset,
                               uint64_t length);
// `handle` naming another owner address ("HOST:PORT"), resealed.
Result<RemoteBuffer> with_address(const RemoteBuffer& handle, std::string_view address);
// `handle` claiming to come from manager `manager_id`, resealed.
Result<RemoteBuffer> with_manager_id(const RemoteBuffer& handle, uint64_t manager_id);
// `handle` with the first character of every backend context's name
// replaced by '#' (so the owner seems to offer only unknown transports),
// resealed.
Result<RemoteBuffer> with_unknown_backends(const RemoteBuffer& handle);
// `handle` naming another buffer id, resealed.
Result<RemoteBuffer> with_id(const RemoteBuffer& handle, uint64_t id);
// `handle` with the data of backend `backend`'s context replaced by `data`,
// resealed. kNotFound when the handle has no such context.
Result<RemoteBuffer> with_context_data(const RemoteBuffer& handle, std::string_view backend,
                                       const std::vector<uint8_t>& data);

// The ibverbs backend's context in a handle (backends/ibverbs/
// handle_context.h): u8 version (2), u8 0, u16 0, u64 address of the
// registered range in the owner, u8 length + device name.
struct IbverbsContext {
  uint8_t version = 2;
  uint64_t addr = 0;
  std::string device;
};
// Decodes `handle`'s ibverbs context; nullopt when there is none or it does
// not parse.
std::optional<IbverbsContext> ibverbs_context(const RemoteBuffer& handle);
std::vector<uint8_t> encode_ibverbs_context(const IbverbsContext& context);
// `handle` with its ibverbs context replaced by `context`, resealed.
Result<RemoteBuffer> with_ibverbs_context(const RemoteBuffer& handle,
                                          const IbverbsContext& context);

}  // namespace rdmabuf::testing
