// The ibverbs backend's context in a handle (docs/wire-format.md, "The
// ibverbs backend's context and handshake"): where the buffer lies at the
// owner, and which device of the owner to ask for a queue pair. It carries
// no remote key: the owner grants one per queue pair to a reader that
// presents the handle (handshake.h). Needs no verbs header, so it builds
// (and is fuzzed) everywhere.
//
//   u8 version (2) | u8[3] 0 | u64 address | u8 length | device name
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rdmabuf/status.h"

namespace rdmabuf::ibverbs {

// A device name on the wire (in the connect message) takes this many bytes,
// NUL padded; so a name has at most kDeviceNameBytes - 1 bytes.
constexpr size_t kDeviceNameBytes = 64;

struct HandleContext {
  std::string device;  // the owner's RDMA device, 1 .. kDeviceNameBytes - 1 bytes, no NUL
  uint64_t addr = 0;   // the registered buffer's address at the owner
};

// The bytes of `context`, format version 2. `context.device` must be a name
// decode_context accepts.
std::vector<uint8_t> encode_context(const HandleContext& context);

// Decodes a handle's context data (bytes from any peer). kInvalidArgument
// unless `data` is exactly one version-2 context with zero reserved bytes
// and a device name of 1 .. kDeviceNameBytes - 1 bytes without a NUL; so a
// context that decodes re-encodes to the same bytes, and its device name
// reaches the owner unchanged in the connect message.
Result<HandleContext> decode_context(std::span<const uint8_t> data);

}  // namespace rdmabuf::ibverbs
