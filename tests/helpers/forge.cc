#include "tests/helpers/forge.h"

#include "common/crc32c.h"

namespace rdmabuf::testing {

void reseal(std::vector<uint8_t>& bytes) {
  poke<uint16_t>(bytes, handle_layout::kTotalLength, static_cast<uint16_t>(bytes.size()));
  uint32_t crc = crc32c(bytes.data(), bytes.size() - 4);
  poke<uint32_t>(bytes, bytes.size() - 4, crc);
}

Result<RemoteBuffer> with_altered_token(const RemoteBuffer& handle, size_t index, uint8_t mask) {
  std::vector<uint8_t> bytes = handle.to_bytes();
  bytes.at(handle_layout::kToken + index) ^= mask;
  reseal(bytes);
  return RemoteBuffer::from_bytes(bytes);
}

Result<RemoteBuffer> with_view(const RemoteBuffer& handle, uint64_t region_size, uint64_t offset,
                               uint64_t length) {
  std::vector<uint8_t> bytes = handle.to_bytes();
  poke(bytes, handle_layout::kRegionSize, region_size);
  poke(bytes, handle_layout::kOffset, offset);
  poke(bytes, handle_layout::kLength, length);
  reseal(bytes);
  return RemoteBuffer::from_bytes(bytes);
}

Result<RemoteBuffer> with_address(const RemoteBuffer& handle, std::string_view address) {
  std::vector<uint8_t> bytes = handle.to_bytes();
  size_t old_len = bytes.at(handle_layout::kAddress);
  std::vector<uint8_t> out(bytes.begin(), bytes.begin() + handle_layout::kAddress);
  out.push_back(static_cast<uint8_t>(address.size()));
  out.insert(out.end(), address.begin(), address.end());
  out.insert(out.end(),
             bytes.begin() + static_cast<ptrdiff_t>(handle_layout::kAddress + 1 + old_len),
             bytes.end());
  reseal(out);
  return RemoteBuffer::from_bytes(out);
}

Result<RemoteBuffer> with_manager_id(const RemoteBuffer& handle, uint64_t manager_id) {
  std::vector<uint8_t> bytes = handle.to_bytes();
  poke(bytes, handle_layout::kManagerId, manager_id);
  reseal(bytes);
  return RemoteBuffer::from_bytes(bytes);
}

Result<RemoteBuffer> with_unknown_backends(const RemoteBuffer& handle) {
  std::vector<uint8_t> bytes = handle.to_bytes();
  size_t at = handle_layout::kAddress;
  at += 1 + bytes.at(at);  // address
  at += 1 + bytes.at(at);  // host id
  const size_t count = bytes.at(at++);
  for (size_t i = 0; i < count; ++i) {
    const size_t name_len = bytes.at(at);
    if (name_len > 0) bytes.at(at + 1) = '#';
    at += 1 + name_len;
    at += 2 + peek<uint16_t>(bytes, at);  // the context's data
  }
  reseal(bytes);
  return RemoteBuffer::from_bytes(bytes);
}

Result<RemoteBuffer> with_id(const RemoteBuffer& handle, uint64_t id) {
  std::vector<uint8_t> bytes = handle.to_bytes();
  poke(bytes, handle_layout::kId, id);
  reseal(bytes);
  return RemoteBuffer::from_bytes(bytes);
}

Result<RemoteBuffer> with_context_data(const RemoteBuffer& handle, std::string_view backend,
                                       const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes = handle.to_bytes();
  size_t at = handle_layout::kAddress;
  at += 1 + bytes.at(at);  // address
  at += 1 + bytes.at(at);  // host id
  const size_t count = bytes.at(at++);
  for (size_t i = 0; i < count; ++i) {
    const size_t name_len = bytes.at(at);
    const std::string_view name(reinterpret_cast<const char*>(bytes.data() + at + 1), name_len);
    at += 1 + name_len;
    const size_t data_len = peek<uint16_t>(bytes, at);
    if (name != backend) {
      at += 2 + data_len;
      continue;
    }
    std::vector<uint8_t> out(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(at));
    const auto new_len = static_cast<uint16_t>(data.size());
    out.push_back(static_cast<uint8_t>(new_len & 0xff));
    out.push_back(static_cast<uint8_t>(new_len >> 8));
    out.insert(out.end(), data.begin(), data.end());
    out.insert(out.end(), bytes.begin() + static_cast<ptrdiff_t>(at + 2 + data_len), bytes.end());
    reseal(out);
    return RemoteBuffer::from_bytes(out);
  }
  return NotFound("the handle has no context for backend '" + std::string(backend) + "'");
}

std::optional<IbverbsContext> ibverbs_context(const RemoteBuffer& handle) {
  const BackendContext* ctx = handle.context("ibverbs");
  if (!ctx) return std::nullopt;
  const std::vector<uint8_t>& d = ctx->data;
  if (d.size() < 13 || d.size() != 13u + d[12]) return std::nullopt;
  IbverbsContext c;
  c.version = d[0];
  c.addr = peek<uint64_t>(d, 4);
  c.device.assign(reinterpret_cast<const char*>(d.data() + 13), d[12]);
  return c;
}

std::vector<uint8_t> encode_ibverbs_context(const IbverbsContext& context) {
  std::vector<uint8_t> out(13, 0);
  out[0] = context.version;
  poke(out, 4, context.addr);
  out[12] = static_cast<uint8_t>(context.device.size());
  for (char ch : context.device)
    out.push_back(static_cast<uint8_t>(ch));
  return out;
}

Result<RemoteBuffer> with_ibverbs_context(const RemoteBuffer& handle,
                                          const IbverbsContext& context) {
  return with_context_data(handle, "ibverbs", encode_ibverbs_context(context));
}

}  // namespace rdmabuf::testing
