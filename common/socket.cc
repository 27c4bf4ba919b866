#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>

#include "common/strings.h"

namespace rdmabuf {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string HostPort::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Result<HostPort> parse_host_port(std::string_view text) {
  text = trim(text);
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument("address '" + std::string(text) + "' is not [IPV6]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return InvalidArgument("address '" + std::string(text) + "' is not HOST:PORT");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) return InvalidArgument("address '" + std::string(text) + "' has no host");
  auto port_number = parse_int(port, 0, 65535);
  if (!port_number) {
    return InvalidArgument("address '" + std::string(text) + "' has no valid port (0..65535)");
  }
  return HostPort{std::string(host), static_cast<uint16_t>(*port_number)};
}

std::string errno_text(int err) {
  char buf[128];
  // GNU strerror_r returns the message pointer.
  const char* msg = strerror_r(err, buf, sizeof buf);
  return msg;
}

namespace {

Result<AddrInfoPtr> resolve(const HostPort& where, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  std::string port = std::to_string(where.port);
  int rc = getaddrinfo(where.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    return Unavailable("cannot resolve '" + where.host + "': " + gai_strerror(rc));
  }
  return AddrInfoPtr(result);
}

Result<HostPort> sockaddr_to_host_port(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host);
    port = ntohs(sin->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof host);
    port = ntohs(sin6->sin6_port);
  } else {
    return Internal("socket has an address family that is not IP");
  }
  return HostPort{host, port};
}

}  // namespace

Result<Fd> listen_tcp(const HostPort& where, int backlog) {
  RDMABUF_ASSIGN_OR_RETURN(AddrInfoPtr ai, resolve(where, true));
  int last_err = 0;
  for (addrinfo* p = ai.get(); p; p = p->ai_next) {
    Fd fd(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, p->ai_protocol));
    if (!fd.valid()) {
      last_err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), p->ai_addr, p->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last_err = errno;
      continue;
    }
    return fd;
  }
  return Unavailable("cannot listen on " + where.to_string() + ": " + errno_text(last_err));
}

Result<HostPort> local_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Internal("getsockname: " + errno_text(errno));
  }
  return sockaddr_to_host_port(ss);
}

Result<HostPort> peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Unavailable("getpeername: " + errno_text(errno));
  }
  return sockaddr_to_host_port(ss);
}

Status set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return Internal("fcntl: " + errno_text(errno));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) return Internal("fcntl: " + errno_text(errno));
  return Status::Ok();
}

namespace {

// An end's address for within_this_host(): IPv4 (an IPv4-mapped IPv6
// address as the IPv4 one) or IPv6, and whether it is loopback.
struct EndAddress {
  int family = AF_UNSPEC;
  std::array<uint8_t, 16> bytes{};
  bool loopback = false;
};

std::optional<EndAddress> end_address(const sockaddr_storage& ss) {
  EndAddress end;
  if (ss.ss_family == AF_INET6) {
    sockaddr_in6 a;
    std::memcpy(&a, &ss, sizeof a);
    if (!IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
      end.family = AF_INET6;
      std::memcpy(end.bytes.data(), &a.sin6_addr, sizeof a.sin6_addr);
      end.loopback = IN6_IS_ADDR_LOOPBACK(&a.sin6_addr);
      return end;
    }
    std::memcpy(end.bytes.data(), a.sin6_addr.s6_addr + 12, 4);  // the IPv4 address
  } else if (ss.ss_family == AF_INET) {
    sockaddr_in a;
    std::memcpy(&a, &ss, sizeof a);
    std::memcpy(end.bytes.data(), &a.sin_addr, 4);
  } else {
    return std::nullopt;
  }
  end.family = AF_INET;
  end.loopback = end.bytes[0] == 127;  // 127.0.0.0/8
  return end;
}

// Whether connected `fd`'s two ends are on this host: both have one
// address (its own, or loopback), or both are loopback.
bool within_this_host(int fd) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t local_size = sizeof local;
  socklen_t peer_size = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) {
    return false;
  }
  const std::optional<EndAddress> a = end_address(local);
  const std::optional<EndAddress> b = end_address(peer);
  if (!a || !b || a->family != b->family) return false;
  return a->bytes == b->bytes || (a->loopback && b->loopback);
}

}  // namespace

void tune_data_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (within_this_host(fd)) {
    const int bytes = kSameHostSocketBuffer;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  }
  set_nonblocking(fd, true).ignore();
}

int poll_timeout_ms(Deadline deadline) {
  if (deadline == Deadline::max()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

Status wait_fd(int fd, short events, Deadline deadline, int stop_fd) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 0) return DeadlineExceeded("timed out waiting for the socket");
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    // Round up so a sub-millisecond remainder still waits.
    int rc = ::poll(fds, stop_fd >= 0 ? 2 : 1,
                    static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return Internal("poll: " + errno_text(errno));
    }
    if (rc == 0) continue;  // re-check the deadline
    if (stop_fd >= 0 && fds[1].revents) return Cancelled("shutting down");
    const pollfd& p = fds[0];
    // Bytes queued before a reset are still there to read: report the
    // readiness asked for first, and the error only when nothing is ready.
    if (p.revents & events) return Status::Ok();
    if (p.revents & (POLLERR | POLLNVAL)) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      return Unavailable(err ? errno_text(err) : "socket error");
    }
    if (p.revents & POLLHUP) return Status::Ok();  // the next read or write says what happened
  }
}

Result<Fd> connect_tcp(const HostPort& where, Deadline deadline, int stop_fd) {
  RDMABUF_ASSIGN_OR_RETURN(TcpConnecting connecting, TcpConnecting::begin(where));
  for (;;) {
    // kUnavailable: the socket erred, which advance() takes as that
    // address's failure.
    Status st = wait_fd(connecting.fd(), POLLOUT, deadline, stop_fd);
    if (!st.ok() && st.code() != StatusCode::kUnavailable) {
      return Status(st.code(), "cannot connect to " + where.to_string() + ": " + st.message());
    }
    RDMABUF_ASSIGN_OR_RETURN(std::optional<Fd> connected, connecting.advance());
    if (connected) return std::move(*connected);
  }
}

bool is_numeric_host(const std::string& host) {
  in6_addr address;
  return ::inet_pton(AF_INET, host.c_str(), &address) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &address) == 1;
}

void AddrInfoDeleter::operator()(addrinfo* ai) const {
  freeaddrinfo(ai);
}

Result<TcpConnecting> TcpConnecting::begin(const HostPort& where) {
  TcpConnecting c;
  RDMABUF_ASSIGN_OR_RETURN(c.addresses_, resolve(where, false));
  c.where_ = where;
  c.next_ = c.addresses_.get();
  c.last_ = Unavailable("no address for " + where.to_string());
  RDMABUF_RETURN_IF_ERROR(c.start_next());
  return c;
}

Status TcpConnecting::start_next() {
  fd_.reset();
  for (; next_ != nullptr; next_ = next_->ai_next) {
    const addrinfo* p = next_;
    Fd fd(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, p->ai_protocol));
    if (!fd.valid()) {
      last_ = Unavailable("socket: " + errno_text(errno));
      continue;
    }
    if (::connect(fd.get(), p->ai_addr, p->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last_ = Unavailable("cannot connect to " + where_.to_string() + ": " + errno_text(errno));
      continue;
    }
    next_ = p->ai_next;
    fd_ = std::move(fd);
    return Status::Ok();
  }
  return last_;
}

Result<std::optional<Fd>> TcpConnecting::advance() {
  pollfd p{fd_.get(), POLLOUT, 0};
  if (::poll(&p, 1, 0) <= 0) return std::optional<Fd>();  // not yet (or EINTR)
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err == 0 && (p.revents & POLLERR) == 0) {
    tune_data_socket(fd_.get());
    return std::optional<Fd>(std::move(fd_));
  }
  last_ = Unavailable("cannot connect to " + where_.to_string() + ": " +
                      (err != 0 ? errno_text(err) : std::string("socket error")));
  RDMABUF_RETURN_IF_ERROR(start_next());
  return std::optional<Fd>();
}

Status send_exact(int fd, const void* data, size_t size, Deadline deadline, int stop_fd) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      RDMABUF_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, deadline, stop_fd));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return Unavailable("send: " + errno_text(errno));
  }
  return Status::Ok();
}

Status send_gathered(int fd, std::span<iovec> pieces, Deadline deadline, int stop_fd,
                     const std::function<void()>& while_blocked) {
  while (!pieces.empty() && pieces.front().iov_len == 0)
    pieces = pieces.subspan(1);
  while (!pieces.empty()) {
    msghdr message{};
    message.msg_iov = pieces.data();
    message.msg_iovlen = std::min<size_t>(pieces.size(), IOV_MAX);
    ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!while_blocked) {
        RDMABUF_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, deadline, stop_fd));
        continue;
      }
      while_blocked();
      const Deadline soon = std::min(deadline, Clock::now() + std::chrono::milliseconds(1));
      Status ready = wait_fd(fd, POLLOUT, soon, stop_fd);
      if (!ready.ok() && (ready.code() != StatusCode::kDeadlineExceeded || soon == deadline)) {
        return ready;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Unavailable("sendmsg: " + errno_text(errno));
    auto sent = static_cast<size_t>(n);
    while (!pieces.empty() && sent >= pieces.front().iov_len) {
      sent -= pieces.front().iov_len;
      pieces = pieces.subspan(1);
    }
    if (sent > 0) {
      pieces.front().iov_base = static_cast<char*>(pieces.front().iov_base) + sent;
      pieces.front().iov_len -= sent;
    }
  }
  return Status::Ok();
}

Status recv_exact(int fd, void* data, size_t size, Deadline deadline, int stop_fd) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable("connection closed by peer");
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      RDMABUF_RETURN_IF_ERROR(wait_fd(fd, POLLIN, deadline, stop_fd));
      continue;
    }
    if (errno == EINTR) continue;
    return Unavailable("recv: " + errno_text(errno));
  }
  return Status::Ok();
}

Result<Fd> make_eventfd() {
  Fd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) return ResourceExhausted("eventfd: " + errno_text(errno));
  return fd;
}

void signal_eventfd(int fd) {
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof one);
  (void)n;  // a full counter is still readable, which is all that matters
}

void drain_eventfd(int fd) {
  uint64_t value = 0;
  ssize_t n = ::read(fd, &value, sizeof value);
  (void)n;
}

}  // namespace rdmabuf
