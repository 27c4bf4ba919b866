// Config: every knob of a Manager, with defaults that work on a laptop and an
// RDMABUF_* environment variable for each field (the README has the table).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rdmabuf/status.h"

namespace rdmabuf {

enum class LogLevel : uint8_t { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };
// "error", "warn", "info" or "debug": the spelling RDMABUF_LOG_LEVEL takes.
const char* log_level_name(LogLevel level);

struct Config {
  // RDMABUF_LISTEN. Where the manager's control listener binds, "HOST:PORT".
  // Loopback and an ephemeral port by default, so nothing is reachable from
  // other hosts unless asked for; "0.0.0.0:PORT" listens on every interface.
  std::string listen_address = "127.0.0.1:0";

  // RDMABUF_ADVERTISE_HOST. The host written into handles for peers to dial.
  // Empty: the listen host, or when that is a wildcard, this host's first
  // non-loopback IPv4 address.
  std::string advertise_host;

  // RDMABUF_BACKENDS. Comma-separated backends this manager may use and
  // offer, e.g. "tcp". Empty: all that are viable.
  std::vector<std::string> backends;

  // RDMABUF_ALLOW_TCP_FALLBACK (0/1). When false, an op that would have to
  // move its bytes over TCP fails with kFailedPrecondition instead. Atomics
  // are exempt: where no mapping of the owner's memory carries them, they
  // go to the owner's manager over TCP.
  bool allow_tcp_fallback = true;

  // RDMABUF_TCP_STREAMS. Connections opened to each peer; large ops are cut
  // into chunks spread over them. 1..64. Four: on a 2-core loopback host,
  // two streams' 1 MiB throughput depended on where the scheduler put
  // their threads; four were faster and steadier.
  // Each stream is a thread and buffers on both sides.
  int tcp_streams = 4;

  // RDMABUF_CHUNK_SIZE (accepts K/M/G suffixes). Ops larger than this are cut
  // into chunks of this size, each an independent request. 4 KiB..1 GiB.
  size_t chunk_size = size_t{1} << 20;

  // RDMABUF_IB_DEVICE. The RDMA device the ibverbs backend uses; empty: the
  // first device with an active port.
  std::string ib_device;

  // RDMABUF_IB_GID_INDEX. The GID index used on that device's port; -1: a
  // RoCE v2 IPv4 GID where there is one, else any RoCE v2 GID, else 0.
  int ib_gid_index = -1;

  // RDMABUF_IB_MAX_MESSAGE (K/M/G suffixes). Ops over ibverbs are cut into
  // work requests of at most this size. 4 KiB..1 GiB.
  size_t ib_max_message = size_t{1} << 20;

  // RDMABUF_BUSY_POLL_US. After activity, I/O threads and waiters spin
  // (yielding the CPU between checks; an endpoint's reader of a shared ring
  // or RDMA channel pauses instead, unless its peer may share its core)
  // this long before they sleep in the kernel. Longer: lower latency for
  // bursts, more CPU burnt. 0 disables.
  std::chrono::microseconds busy_poll{200};

  // RDMABUF_TIMEOUT_MS. Deadline of the blocking read_into / write_from
  // conveniences when no timeout is given.
  std::chrono::milliseconds default_timeout{30000};

  // RDMABUF_IO_STALL_TIMEOUT_MS. A manager serving a peer drops the
  // connection when the peer stops mid-frame (sends half a request, or stops
  // reading a response) for this long. Idle connections are never dropped.
  std::chrono::milliseconds io_stall_timeout{30000};

  // RDMABUF_MAX_CONNECTIONS. Inbound connections a manager serves at once.
  // At the limit it closes the idle connection that has waited longest (its
  // peer reconnects on its next op, unaware), and refuses a connection with
  // kResourceExhausted only when none is idle. 0: set by the file
  // descriptors the process may open (the manager raises its soft
  // RLIMIT_NOFILE to the hard limit), less an eighth kept for the rest of
  // the process.
  int max_connections = 0;

  // RDMABUF_IO_THREADS. Threads that serve every inbound connection (tcp
  // data, and the owner's side of readers' ibverbs queue pairs), and as
  // many that drive the outbound ones, tcp streams and ibverbs queue pairs
  // alike, and wait for the endpoints' events (event loops started on the
  // first op over either, or the first endpoint), however many peers and
  // endpoints there are. 0: as many as the cores, within 4..16.
  int io_threads = 0;

  // RDMABUF_LEND_LIMIT (K/M/G suffixes). Bytes this manager lends at once
  // to peers that ask through an endpoint (Endpoint::request_remote_buffer);
  // a request beyond it is refused with kResourceExhausted. 0: lend nothing.
  size_t lend_limit = size_t{1} << 30;

  // RDMABUF_LEND_DEVICE. Where lent memory is: -1 in host memory, N on GPU
  // N (this process's CUDA numbering).
  int lend_device = -1;

  // RDMABUF_MAX_LEASE_MS. The longest lease this manager grants on memory it
  // lends (a longer request is granted this long).
  std::chrono::milliseconds max_lease{3'600'000};

  // RDMABUF_LOG_LEVEL: error | warn | info | debug. Logs go to stderr.
  LogLevel log_level = LogLevel::kWarn;

  // Defaults overridden by the RDMABUF_* variables present in the
  // environment. An unparsable value is kInvalidArgument naming the variable.
  static Result<Config> from_env();

  // Checks ranges and formats; kInvalidArgument naming the field.
  Status validate() const;

  // One "name = value" line per field, for `rdmabuf info`.
  std::vector<std::pair<std::string, std::string>> describe() const;
};

// Parses "4096", "64K", "4M", "1G" (binary multiples). kInvalidArgument on
// garbage, or for 2^63 bytes or more (with a suffix as without).
Result<size_t> parse_size(std::string_view text);

}  // namespace rdmabuf
