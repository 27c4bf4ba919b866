// Fuzzes configuration parsing (common/config.cc, common/strings.cc,
// common/socket.cc): the RDMABUF_* variables Config::from_env reads, the
// size syntax (parse_size), and HOST:PORT addresses (parse_host_port, which
// also reads the owner address of every handle).
//
// Feeds the whole input to parse_size and parse_host_port, and its bytes
// after the first, up to a NUL, as the value of the RDMABUF_* variable the
// first byte picks, to Config::from_env (with no other RDMABUF_* variable
// set).
//
// Checks that a size that parses is a whole multiple of its suffix, neither
// overflowed nor negative, and reads back from its decimal form, and that
// digits with an optional K/M/G parse to exactly their value, or fail when
// that is 2^63 or more; that an address that parses has a host and reads
// back from its text form (for plain host names and IP literals); that
// from_env refuses only with InvalidArgument and returns only
// configurations that validate().
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "common/socket.h"
#include "common/strings.h"
#include "fuzz/fuzz_support.h"
#include "rdmabuf/config.h"

namespace rdmabuf::fuzz {
namespace {

constexpr const char* kVariables[] = {"RDMABUF_LISTEN",          "RDMABUF_ADVERTISE_HOST",
                                      "RDMABUF_BACKENDS",        "RDMABUF_ALLOW_TCP_FALLBACK",
                                      "RDMABUF_TCP_STREAMS",     "RDMABUF_CHUNK_SIZE",
                                      "RDMABUF_IB_DEVICE",       "RDMABUF_IB_GID_INDEX",
                                      "RDMABUF_IB_MAX_MESSAGE",  "RDMABUF_BUSY_POLL_US",
                                      "RDMABUF_TIMEOUT_MS",      "RDMABUF_IO_STALL_TIMEOUT_MS",
                                      "RDMABUF_MAX_CONNECTIONS", "RDMABUF_IO_THREADS",
                                      "RDMABUF_LOG_LEVEL"};

uint64_t multiplier_of(char suffix) {
  switch (suffix) {
    case 'K':
    case 'k':
      return uint64_t{1} << 10;
    case 'M':
    case 'm':
      return uint64_t{1} << 20;
    case 'G':
    case 'g':
      return uint64_t{1} << 30;
    default:
      return 1;
  }
}

void check_size(std::string_view text) {
  auto size = parse_size(text);
  std::string_view t = trim(text);
  uint64_t multiplier = t.empty() ? 1 : multiplier_of(t.back());
  if (size.ok()) {
    RDMABUF_FUZZ_CHECK(*size % multiplier == 0);
    RDMABUF_FUZZ_CHECK(*size <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    auto again = parse_size(std::to_string(*size));
    RDMABUF_FUZZ_CHECK(again.ok() && *again == *size);
  }
  // Up to 18 digits and an optional suffix parse to exactly their value,
  // unless that is 2^63 or more.
  std::string_view digits = multiplier == 1 ? t : t.substr(0, t.size() - 1);
  if (!digits.empty() && digits.size() <= 18 &&
      digits.find_first_not_of("0123456789") == std::string_view::npos) {
    uint64_t value = 0;
    for (char c : digits)
      value = value * 10 + static_cast<uint64_t>(c - '0');
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(value, multiplier, &bytes) ||
        bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      RDMABUF_FUZZ_CHECK(!size.ok());
    } else {
      RDMABUF_FUZZ_CHECK(size.ok() && *size == bytes);
    }
  }
}

void check_address(std::string_view text) {
  auto address = parse_host_port(text);
  if (!address.ok()) {
    RDMABUF_FUZZ_CHECK(address.status().code() == StatusCode::kInvalidArgument);
    return;
  }
  RDMABUF_FUZZ_CHECK(!address->host.empty());
  if (address->host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789.-:") == std::string::npos) {
    auto again = parse_host_port(address->to_string());
    RDMABUF_FUZZ_CHECK(again.ok() && again->host == address->host && again->port == address->port);
  }
}

void check_env(std::span<const uint8_t> in) {
  if (in.empty()) return;
  const char* name = kVariables[in[0] % std::size(kVariables)];
  std::string value(reinterpret_cast<const char*>(in.data()) + 1, in.size() - 1);
  value.resize(std::strlen(value.c_str()));  // an environment value ends at its first NUL
  ::setenv(name, value.c_str(), 1);
  auto config = Config::from_env();
  ::unsetenv(name);
  if (config.ok()) {
    RDMABUF_FUZZ_CHECK(config->validate().ok());
  } else {
    RDMABUF_FUZZ_CHECK(config.status().code() == StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace rdmabuf::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const char* name : rdmabuf::fuzz::kVariables)
    ::unsetenv(name);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  rdmabuf::fuzz::check_size(text);
  rdmabuf::fuzz::check_address(text);
  rdmabuf::fuzz::check_env(std::span<const uint8_t>(data, size));
  return 0;
}
