#include "common/socket_holder.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/socket.h"

namespace rdmabuf {
namespace {

// Copies the address and port of `a` into sock_diag's form.
bool put_address(const sockaddr_storage& a, __be32 (&address)[4], __be16& port) {
  std::memset(address, 0, sizeof address);
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    std::memcpy(address, &v4.sin_addr, sizeof v4.sin_addr);
    port = v4.sin_port;
    return true;
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    std::memcpy(address, &v6.sin6_addr, sizeof v6.sin6_addr);
    port = v6.sin6_port;
    return true;
  }
  return false;
}

// The inode of the TCP socket whose local end is `local` and remote end
// `remote`, asked of the kernel by its exact addresses.
Result<ino_t> tcp_socket_inode(const sockaddr_storage& local, const sockaddr_storage& remote) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } ask{};
  ask.header.nlmsg_len = sizeof ask;
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST;
  ask.request.sdiag_family = static_cast<uint8_t>(local.ss_family);
  ask.request.sdiag_protocol = IPPROTO_TCP;
  ask.request.idiag_states = ~0u;
  ask.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  ask.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (!put_address(local, ask.request.id.idiag_src, ask.request.id.idiag_sport) ||
      !put_address(remote, ask.request.id.idiag_dst, ask.request.id.idiag_dport)) {
    return FailedPrecondition("not an IPv4 or IPv6 connection");
  }
  Fd diag(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!diag.valid()) return FailedPrecondition("no sock_diag here: " + errno_text(errno));
  timeval patience{1, 0};  // the kernel answers at once; never wait for ever
  ::setsockopt(diag.get(), SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(diag.get(), &ask, sizeof ask, 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof kernel) != static_cast<ssize_t>(sizeof ask)) {
    return FailedPrecondition("sock_diag: " + errno_text(errno));
  }
  // An exact request gets one message: the socket, or an error.
  alignas(nlmsghdr) char reply[8192];
  const ssize_t n = ::recv(diag.get(), reply, sizeof reply, 0);
  if (n < 0) return FailedPrecondition("sock_diag: " + errno_text(errno));
  nlmsghdr header{};
  if (static_cast<size_t>(n) < sizeof header) return FailedPrecondition("sock_diag: short answer");
  std::memcpy(&header, reply, sizeof header);
  const size_t body = NLMSG_HDRLEN;
  if (header.nlmsg_type == NLMSG_ERROR && static_cast<size_t>(n) >= body + sizeof(nlmsgerr)) {
    nlmsgerr error{};
    std::memcpy(&error, reply + body, sizeof error);
    return PermissionDenied("no such connection is known to the kernel (" +
                            errno_text(-error.error) + ")");
  }
  if (header.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
      static_cast<size_t>(n) >= body + sizeof(inet_diag_msg)) {
    inet_diag_msg found{};
    std::memcpy(&found, reply + body, sizeof found);
    return static_cast<ino_t>(found.idiag_inode);
  }
  return FailedPrecondition("sock_diag gave no answer");
}

}  // namespace

Status check_socket_holder(int fd, pid_t pid, int peer_fd) {
  if (pid <= 0 || peer_fd < 0) return PermissionDenied("the peer named no process");
  sockaddr_storage mine{}, theirs{};
  socklen_t mine_size = sizeof mine, theirs_size = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_size) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_size) != 0) {
    return FailedPrecondition("cannot tell the connection's addresses: " + errno_text(errno));
  }
  // The other end's socket: local and remote swapped.
  RDMABUF_ASSIGN_OR_RETURN(ino_t inode, tcp_socket_inode(theirs, mine));
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(peer_fd);
  char target[64];
  const ssize_t length = ::readlink(path.c_str(), target, sizeof target - 1);
  if (length < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return PermissionDenied("process " + std::to_string(pid) + " has no descriptor " +
                              std::to_string(peer_fd));
    }
    return FailedPrecondition("cannot look at " + path + ": " + errno_text(err));
  }
  target[length] = '\0';
  if (std::string(target) != "socket:[" + std::to_string(inode) + "]") {
    return PermissionDenied("process " + std::to_string(pid) +
                            " does not hold the other end of this connection");
  }
  return Status::Ok();
}

}  // namespace rdmabuf
