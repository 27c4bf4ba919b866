// membarrier(2), which glibc does not wrap: it makes running threads pass a
// full memory fence, so that the rare side of a store-then-load handshake
// can pay for the frequent side's fence (the shared rings' doorbells,
// core/endpoint/shm_channel.h; FutexMutex's unlock, common/futex_mutex.h).
#pragma once

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace rdmabuf {

// The system call as it returns: 0 (or, for MEMBARRIER_CMD_QUERY, the
// commands offered) on success, -1 with errno set on failure.
inline long membarrier(int command) {
  return ::syscall(__NR_membarrier, command, 0u, 0);
}

// Registers this process for `command` (with `register_command`) where the
// kernel offers both: whether it did.
inline bool register_membarrier(int command, int register_command) {
  const long offered = membarrier(MEMBARRIER_CMD_QUERY);
  const long needed = static_cast<long>(command) | register_command;
  return offered >= 0 && (offered & needed) == needed && membarrier(register_command) == 0;
}

}  // namespace rdmabuf
