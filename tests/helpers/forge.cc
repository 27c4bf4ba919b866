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

}  // namespace rdmabuf::testing
