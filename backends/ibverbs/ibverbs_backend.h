// The ibverbs backend: RDMA READ and WRITE over RC queue pairs, NIC to NIC.
#pragma once

#include <memory>

#include "rdmabuf/backend.h"

namespace rdmabuf::ibverbs {

// Viable where libibverbs loads and a device has an active port; otherwise
// the status says why (no library, no devices, no active port).
Result<std::unique_ptr<Backend>> make_ibverbs_backend(const BackendEnv& env);

}  // namespace rdmabuf::ibverbs
