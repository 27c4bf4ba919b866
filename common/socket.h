// File descriptors and TCP sockets: RAII, address parsing, and the blocking
// helpers (with deadlines) used for handshakes. The data paths do their own
// non-blocking I/O on top of these.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "rdmabuf/status.h"
#include "rdmabuf/transfer.h"

struct addrinfo;

namespace rdmabuf {

// Owns one file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
  // "host:port", with brackets around IPv6 literals.
  std::string to_string() const;
};

// Parses "HOST:PORT" or "[V6]:PORT". kInvalidArgument on malformed input.
Result<HostPort> parse_host_port(std::string_view text);

// strerror(err) as a string.
std::string errno_text(int err);

// A listening TCP socket bound to `where` (port 0: ephemeral), non-blocking,
// SO_REUSEADDR, close-on-exec. kUnavailable when it cannot bind.
Result<Fd> listen_tcp(const HostPort& where, int backlog);
// The address a socket is bound to.
Result<HostPort> local_address(int fd);
// The address of the other end of a connected socket.
Result<HostPort> peer_address(int fd);

// Connects to `where` before `deadline`. The socket returned is
// non-blocking, TCP_NODELAY, close-on-exec. kUnavailable on refusal,
// unreachable hosts or name lookup failure; kDeadlineExceeded on timeout.
Result<Fd> connect_tcp(const HostPort& where, Deadline deadline, int stop_fd = -1);

// Owns the list getaddrinfo() returns.
struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const;
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// Whether `host` is an IPv4 or IPv6 address, which needs no name lookup.
bool is_numeric_host(const std::string& host);

// connect_tcp for a caller that does not block (an event loop): begin()
// starts connecting to the first address of `where`; whenever fd() turns
// writable (or errs), advance() says whether it is connected, or has moved
// on to the next address (fd() then is another socket), or has failed on
// every address.
class TcpConnecting {
 public:
  // kUnavailable when the name does not resolve or no address can even be
  // tried. Blocks only to look a name up (never for a numeric host).
  static Result<TcpConnecting> begin(const HostPort& where);
  int fd() const { return fd_.get(); }
  // The connected socket, tuned as connect_tcp's; nullopt while still
  // connecting (also when called before fd() is ready); kUnavailable with
  // the last address's error once none is left.
  Result<std::optional<Fd>> advance();

 private:
  // Starts on addresses from next_ on; kUnavailable when none is left.
  Status start_next();

  HostPort where_;
  AddrInfoPtr addresses_;
  addrinfo* next_ = nullptr;  // the address after the one fd_ connects to
  Fd fd_;
  Status last_;  // why the previous address failed
};

// Socket options every rdmabuf data connection gets: no Nagle,
// non-blocking, and, between two ends on this host (one address, or
// loopback), a send buffer of kSameHostSocketBuffer bytes instead of the
// kernel's autotuned one (which grows to megabytes): the sender then waits
// for the receiver to copy out before it copies in more, and the bytes stay
// in the cache in between. Measured on loopback, 16 one-sided writes in
// flight: 1 MiB 5.4 -> 10-11 GB/s. Between hosts the
// kernel's autotuning stays: a window must cover the path's
// bandwidth-delay product.
//
// The receive buffer is never set. Shrunk after the handshake (the window
// scale is fixed by then) and small beside many small segments' overhead,
// it made the kernel prune queued data and drop what came next: the sender
// waited out retransmission timeouts, backed off up to the stall timeout,
// and `rdmabuf soak` over tcp lost ops (1.4k ops/s and 68 failed ops in
// 20 s, against 5.0k ops/s and none without it).
void tune_data_socket(int fd);
inline constexpr int kSameHostSocketBuffer = 128 << 10;
Status set_nonblocking(int fd, bool on);

// Every blocking helper below also watches `stop_fd` (an eventfd that turns
// readable, and stays so, when its owner shuts down; -1 for none) and
// returns kCancelled when it fires.

// The timeout poll() and epoll_wait() take to wait until `deadline`: whole
// milliseconds, rounded up (never waking early), -1 for Deadline::max().
int poll_timeout_ms(Deadline deadline);

// Waits until `fd` is ready for `events` (POLLIN/POLLOUT) or `deadline`.
// kDeadlineExceeded on timeout; kUnavailable when the socket errored.
Status wait_fd(int fd, short events, Deadline deadline, int stop_fd = -1);

// Blocking-with-deadline transfers of exactly `size` bytes on a non-blocking
// socket. kUnavailable when the peer closes or errors; kDeadlineExceeded.
Status send_exact(int fd, const void* data, size_t size, Deadline deadline, int stop_fd = -1);
Status recv_exact(int fd, void* data, size_t size, Deadline deadline, int stop_fd = -1);
// send_exact of the bytes of `pieces` in turn, gathered by the kernel (no
// copy to join them). The iovecs are consumed: partly sent ones advanced.
// `while_blocked`, when given, runs while the socket has no room, about
// every millisecond (a writer that must also read, so that two peers that
// both write do not wait on each other for ever).
Status send_gathered(int fd, std::span<iovec> pieces, Deadline deadline, int stop_fd = -1,
                     const std::function<void()>& while_blocked = {});

// A non-blocking eventfd that can be waited on by the helpers above.
Result<Fd> make_eventfd();
// Makes an eventfd readable (adds 1).
void signal_eventfd(int fd);
// Resets an eventfd to not readable.
void drain_eventfd(int fd);

}  // namespace rdmabuf
