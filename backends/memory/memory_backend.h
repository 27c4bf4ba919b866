// The memory backend: processes on one host copy straight between their
// address spaces with the kernel's cross-memory attach (process_vm_readv /
// process_vm_writev): one copy, no socket, no thread of the owner involved.
#pragma once

#include <memory>

#include "rdmabuf/backend.h"

namespace rdmabuf::memory {

// Viable where the kernel allows cross-memory attach. Which peers it can
// reach is decided per owner (same host, same PID namespace, ptrace access),
// with the reason recorded when it cannot.
Result<std::unique_ptr<Backend>> make_memory_backend(const BackendEnv& env);

}  // namespace rdmabuf::memory
