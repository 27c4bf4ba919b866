// Files two processes map at once: a memfd one creates and the other opens
// through /proc/PID/fd/FD. Either holds it read-write, so either could
// shrink it under the other's mapping, and the other's next load past the
// new end would kill it with SIGBUS. So such a file is sealed at its size,
// and a file that is not is never mapped.
#pragma once

#include <cstddef>
#include <string>

#include "common/socket.h"
#include "rdmabuf/status.h"

namespace rdmabuf {

// A new zero-filled memfd of `bytes` bytes, sealed at that size (and its
// seals sealed). `what` names it in errors ("the shared state").
// kResourceExhausted when the kernel refuses.
Result<Fd> create_sealed_memfd(const char* name, size_t bytes, const std::string& what);

// Whether `fd` is a file of exactly `bytes` bytes that can neither shrink
// nor grow.
bool sealed_at_size(int fd, size_t bytes);

}  // namespace rdmabuf
