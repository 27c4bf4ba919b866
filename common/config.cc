#include <cstdlib>
#include <limits>

#include "common/socket.h"
#include "common/strings.h"
#include "rdmabuf/config.h"

namespace rdmabuf {
namespace {

constexpr size_t kMinChunk = 4096;
constexpr size_t kMaxChunk = size_t{1} << 30;

std::optional<LogLevel> parse_log_level(std::string_view text) {
  text = trim(text);
  if (text == "error") return LogLevel::kError;
  if (text == "warn" || text == "warning") return LogLevel::kWarn;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  return std::nullopt;
}

Status bad_env(const char* name, const char* value, std::string_view expected) {
  return InvalidArgument(std::string(name) + "='" + value + "': expected " + std::string(expected));
}

}  // namespace

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

Result<size_t> parse_size(std::string_view text) {
  text = trim(text);
  if (text.empty()) return InvalidArgument("empty size");
  uint64_t multiplier = 1;
  char last = text.back();
  if (last == 'K' || last == 'k') multiplier = uint64_t{1} << 10;
  if (last == 'M' || last == 'm') multiplier = uint64_t{1} << 20;
  if (last == 'G' || last == 'g') multiplier = uint64_t{1} << 30;
  if (multiplier != 1) text.remove_suffix(1);
  auto number = parse_int(text, 0, std::numeric_limits<int64_t>::max());
  if (!number)
    return InvalidArgument("'" + std::string(text) + "' is not a size (e.g. 4096, 64K, 4M)");
  // Every size stays below 2^63, suffix or not, so each one also reads back
  // from its plain decimal form.
  uint64_t value = static_cast<uint64_t>(*number);
  if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / multiplier) {
    return InvalidArgument("size '" + std::string(text) + "' overflows");
  }
  return static_cast<size_t>(value * multiplier);
}

Result<Config> Config::from_env() {
  Config c;
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return (v && *v) ? v : nullptr;
  };
  if (const char* v = env("RDMABUF_LISTEN")) c.listen_address = v;
  if (const char* v = env("RDMABUF_ADVERTISE_HOST")) c.advertise_host = v;
  if (const char* v = env("RDMABUF_BACKENDS")) c.backends = split_list(v);
  if (const char* v = env("RDMABUF_ALLOW_TCP_FALLBACK")) {
    auto b = parse_bool(v);
    if (!b) return bad_env("RDMABUF_ALLOW_TCP_FALLBACK", v, "0 or 1");
    c.allow_tcp_fallback = *b;
  }
  if (const char* v = env("RDMABUF_TCP_STREAMS")) {
    auto n = parse_int(v, 1, 64);
    if (!n) return bad_env("RDMABUF_TCP_STREAMS", v, "an integer in 1..64");
    c.tcp_streams = static_cast<int>(*n);
  }
  if (const char* v = env("RDMABUF_CHUNK_SIZE")) {
    auto n = parse_size(v);
    if (!n.ok()) return bad_env("RDMABUF_CHUNK_SIZE", v, "a size such as 1M");
    c.chunk_size = *n;
  }
  if (const char* v = env("RDMABUF_IB_DEVICE")) c.ib_device = v;
  if (const char* v = env("RDMABUF_IB_GID_INDEX")) {
    auto n = parse_int(v, -1, 65535);
    if (!n) return bad_env("RDMABUF_IB_GID_INDEX", v, "an index in 0..65535, or -1 for automatic");
    c.ib_gid_index = static_cast<int>(*n);
  }
  if (const char* v = env("RDMABUF_IB_MAX_MESSAGE")) {
    auto n = parse_size(v);
    if (!n.ok()) return bad_env("RDMABUF_IB_MAX_MESSAGE", v, "a size such as 1M");
    c.ib_max_message = *n;
  }
  if (const char* v = env("RDMABUF_BUSY_POLL_US")) {
    auto n = parse_int(v, 0, 10'000'000);
    if (!n) return bad_env("RDMABUF_BUSY_POLL_US", v, "microseconds in 0..10000000");
    c.busy_poll = std::chrono::microseconds(*n);
  }
  if (const char* v = env("RDMABUF_TIMEOUT_MS")) {
    auto n = parse_int(v, 1, int64_t{1} << 40);
    if (!n) return bad_env("RDMABUF_TIMEOUT_MS", v, "milliseconds > 0");
    c.default_timeout = std::chrono::milliseconds(*n);
  }
  if (const char* v = env("RDMABUF_IO_STALL_TIMEOUT_MS")) {
    auto n = parse_int(v, 1, int64_t{1} << 40);
    if (!n) return bad_env("RDMABUF_IO_STALL_TIMEOUT_MS", v, "milliseconds > 0");
    c.io_stall_timeout = std::chrono::milliseconds(*n);
  }
  if (const char* v = env("RDMABUF_MAX_CONNECTIONS")) {
    auto n = parse_int(v, 0, 1'000'000);
    if (!n) return bad_env("RDMABUF_MAX_CONNECTIONS", v, "an integer >= 0 (0: automatic)");
    c.max_connections = static_cast<int>(*n);
  }
  if (const char* v = env("RDMABUF_IO_THREADS")) {
    auto n = parse_int(v, 0, 1024);
    if (!n) return bad_env("RDMABUF_IO_THREADS", v, "an integer in 0..1024 (0: automatic)");
    c.io_threads = static_cast<int>(*n);
  }
  if (const char* v = env("RDMABUF_LEND_LIMIT")) {
    auto n = parse_size(v);
    if (!n.ok()) return bad_env("RDMABUF_LEND_LIMIT", v, "a size such as 1G, or 0");
    c.lend_limit = *n;
  }
  if (const char* v = env("RDMABUF_LEND_DEVICE")) {
    auto n = parse_int(v, -1, 1023);
    if (!n) return bad_env("RDMABUF_LEND_DEVICE", v, "-1 (host memory) or a GPU's ordinal");
    c.lend_device = static_cast<int>(*n);
  }
  if (const char* v = env("RDMABUF_MAX_LEASE_MS")) {
    auto n = parse_int(v, 1, int64_t{1} << 40);
    if (!n) return bad_env("RDMABUF_MAX_LEASE_MS", v, "milliseconds > 0");
    c.max_lease = std::chrono::milliseconds(*n);
  }
  if (const char* v = env("RDMABUF_LOG_LEVEL")) {
    auto level = parse_log_level(v);
    if (!level) return bad_env("RDMABUF_LOG_LEVEL", v, "error, warn, info or debug");
    c.log_level = *level;
  }
  RDMABUF_RETURN_IF_ERROR(c.validate());
  return c;
}

Status Config::validate() const {
  // Messages name the field and the variable that sets it, so that whoever
  // reads them knows what to fix either way.
  auto listen = parse_host_port(listen_address);
  if (!listen.ok()) return listen.status().with_context("listen_address (RDMABUF_LISTEN)");
  if (tcp_streams < 1 || tcp_streams > 64) {
    return InvalidArgument("tcp_streams (RDMABUF_TCP_STREAMS) = " + std::to_string(tcp_streams) +
                           ": must be in 1..64");
  }
  if (chunk_size < kMinChunk || chunk_size > kMaxChunk) {
    return InvalidArgument("chunk_size (RDMABUF_CHUNK_SIZE) = " + std::to_string(chunk_size) +
                           ": must be in 4 KiB..1 GiB");
  }
  if (ib_max_message < kMinChunk || ib_max_message > kMaxChunk) {
    return InvalidArgument("ib_max_message (RDMABUF_IB_MAX_MESSAGE) = " +
                           std::to_string(ib_max_message) + ": must be in 4 KiB..1 GiB");
  }
  if (ib_gid_index < -1)
    return InvalidArgument("ib_gid_index (RDMABUF_IB_GID_INDEX) must be >= -1");
  if (busy_poll.count() < 0) {
    return InvalidArgument("busy_poll (RDMABUF_BUSY_POLL_US) must be >= 0");
  }
  if (default_timeout.count() <= 0) {
    return InvalidArgument("default_timeout (RDMABUF_TIMEOUT_MS) must be > 0");
  }
  if (io_stall_timeout.count() <= 0) {
    return InvalidArgument("io_stall_timeout (RDMABUF_IO_STALL_TIMEOUT_MS) must be > 0");
  }
  if (max_connections < 0) {
    return InvalidArgument("max_connections (RDMABUF_MAX_CONNECTIONS) must be >= 0");
  }
  if (io_threads < 0 || io_threads > 1024) {
    return InvalidArgument("io_threads (RDMABUF_IO_THREADS) must be in 0..1024");
  }
  if (max_lease.count() <= 0) {
    return InvalidArgument("max_lease (RDMABUF_MAX_LEASE_MS) must be > 0");
  }
  return Status::Ok();
}

std::vector<std::pair<std::string, std::string>> Config::describe() const {
  std::string backend_list;
  for (const auto& b : backends)
    backend_list += (backend_list.empty() ? "" : ",") + b;
  return {
      {"listen_address", listen_address},
      {"advertise_host", advertise_host.empty() ? "(auto)" : advertise_host},
      {"backends", backend_list.empty() ? "(all viable)" : backend_list},
      {"allow_tcp_fallback", allow_tcp_fallback ? "1" : "0"},
      {"tcp_streams", std::to_string(tcp_streams)},
      {"chunk_size", format_bytes(chunk_size)},
      {"ib_device", ib_device.empty() ? "(first with an active port)" : ib_device},
      {"ib_gid_index", ib_gid_index < 0 ? "(auto)" : std::to_string(ib_gid_index)},
      {"ib_max_message", format_bytes(ib_max_message)},
      {"busy_poll_us", std::to_string(busy_poll.count())},
      {"default_timeout_ms", std::to_string(default_timeout.count())},
      {"io_stall_timeout_ms", std::to_string(io_stall_timeout.count())},
      {"max_connections",
       max_connections == 0 ? "(by file descriptors)" : std::to_string(max_connections)},
      {"io_threads", io_threads == 0 ? "(by cores)" : std::to_string(io_threads)},
      {"lend_limit", format_bytes(lend_limit)},
      {"lend_device",
       lend_device < 0 ? std::string("host") : "cuda:" + std::to_string(lend_device)},
      {"max_lease_ms", std::to_string(max_lease.count())},
      {"log_level", log_level_name(log_level)},
  };
}

}  // namespace rdmabuf
