// The tcp backend: works between any two hosts that can reach each other.
#pragma once

#include <memory>

#include "rdmabuf/backend.h"

namespace rdmabuf::tcp {

// Always viable where sockets work. The owner serves reads and writes from
// its registry over the data channel of its manager's listener.
Result<std::unique_ptr<Backend>> make_tcp_backend(const BackendEnv& env);

}  // namespace rdmabuf::tcp
