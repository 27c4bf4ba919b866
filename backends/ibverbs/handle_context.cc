#include "backends/ibverbs/handle_context.h"

#include "common/wire.h"

namespace rdmabuf::ibverbs {
namespace {
// 2: no remote key (the owner grants one per queue pair: handshake.h)
constexpr uint8_t kContextVersion = 2;
}  // namespace

std::vector<uint8_t> encode_context(const HandleContext& c) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint8_t>(kContextVersion);
  w.put<uint8_t>(0);
  w.put<uint16_t>(0);
  w.put<uint64_t>(c.addr);
  w.short_string(c.device);
  return out;
}

Result<HandleContext> decode_context(std::span<const uint8_t> data) {
  WireReader r(data);
  HandleContext c;
  uint8_t version = r.get<uint8_t>();
  uint8_t reserved0 = r.get<uint8_t>();
  uint16_t reserved1 = r.get<uint16_t>();
  c.addr = r.get<uint64_t>();
  c.device = r.short_string();
  if (!r.ok() || r.remaining() != 0 || version != kContextVersion || reserved0 != 0 ||
      reserved1 != 0 || c.device.empty() || c.device.size() >= kDeviceNameBytes ||
      c.device.find('\0') != std::string::npos) {
    return InvalidArgument("malformed ibverbs context in the handle");
  }
  return c;
}

}  // namespace rdmabuf::ibverbs
