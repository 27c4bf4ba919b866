// Small text helpers shared by every layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmabuf/status.h"

namespace rdmabuf {

std::string_view trim(std::string_view text);
// Splits on `sep`, trims each piece, drops empty pieces.
std::vector<std::string> split_list(std::string_view text, char sep = ',');
// "1", "true", "yes", "on" / "0", "false", "no", "off" (any case).
std::optional<bool> parse_bool(std::string_view text);
// A decimal integer in [min, max]; nullopt otherwise.
std::optional<int64_t> parse_int(std::string_view text, int64_t min, int64_t max);
// 4096 -> "4 KiB", 1536 -> "1.5 KiB", 100 -> "100 B".
std::string format_bytes(uint64_t bytes);
// Hex of a 64-bit id, 16 digits.
std::string hex_id(uint64_t id);

}  // namespace rdmabuf
