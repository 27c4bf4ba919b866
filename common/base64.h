#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmabuf {

// Unpadded base64url (RFC 4648 section 5).
std::string base64url_encode(std::span<const uint8_t> bytes);
// nullopt on any character outside the alphabet or an impossible length.
std::optional<std::vector<uint8_t>> base64url_decode(std::string_view text);

}  // namespace rdmabuf
