// Which process holds the other end of a TCP connection on this host: what
// SO_PEERCRED tells of a Unix socket, which TCP sockets do not record. A
// same-host peer that names its process (an endpoint's shared-memory offer)
// is checked against the connection itself before anything of that process
// is opened.
#pragma once

#include <sys/types.h>

#include "rdmabuf/status.h"

namespace rdmabuf {

// OK when process `pid` has, as its descriptor `peer_fd`, the socket at the
// other end of `fd` (this process's end of a TCP connection within this
// host and network namespace). The kernel names that socket (its inode, by
// the connection's addresses and ports, through sock_diag), and
// /proc/PID/fd/PEER_FD must be it. kPermissionDenied, saying why, when it is
// not; kFailedPrecondition when this cannot be told here (no sock_diag, no
// /proc, another user's process).
Status check_socket_holder(int fd, pid_t pid, int peer_fd);

}  // namespace rdmabuf
