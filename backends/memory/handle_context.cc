#include "backends/memory/handle_context.h"

#include "backends/memory/shared_state.h"
#include "common/wire.h"

namespace rdmabuf::memory {
namespace {
constexpr uint8_t kContextVersion = 1;
}  // namespace

std::vector<uint8_t> encode_context(const HandleContext& c) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint8_t>(kContextVersion);
  w.put<uint8_t>(0);
  w.put<uint16_t>(0);
  w.put<uint32_t>(c.pid);
  w.put<uint64_t>(c.pid_namespace);
  w.put<uint32_t>(c.state_fd);
  w.put<uint32_t>(c.slot);
  w.put<uint64_t>(c.generation);
  w.put<uint64_t>(c.base);
  w.put<uint64_t>(c.segment_address);
  return out;
}

Result<HandleContext> decode_context(std::span<const uint8_t> data) {
  WireReader r(data);
  HandleContext c;
  uint8_t version = r.get<uint8_t>();
  uint8_t reserved0 = r.get<uint8_t>();
  uint16_t reserved1 = r.get<uint16_t>();
  c.pid = r.get<uint32_t>();
  c.pid_namespace = r.get<uint64_t>();
  c.state_fd = r.get<uint32_t>();
  c.slot = r.get<uint32_t>();
  c.generation = r.get<uint64_t>();
  c.base = r.get<uint64_t>();
  c.segment_address = r.get<uint64_t>();
  if (!r.ok() || r.remaining() != 0 || version != kContextVersion || reserved0 != 0 ||
      reserved1 != 0 || c.slot >= kSlots || c.pid == 0) {
    return InvalidArgument("malformed memory context in the handle");
  }
  return c;
}

}  // namespace rdmabuf::memory
