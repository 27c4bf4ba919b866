#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmabuf {

// CRC-32C (Castagnoli) of `size` bytes; catches corrupted handles.
uint32_t crc32c(const void* data, size_t size);

}  // namespace rdmabuf
