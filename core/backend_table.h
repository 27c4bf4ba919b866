// Every backend rdmabuf knows, in priority order (best transport first).
// Adding a transport means adding one line here (docs/adding-a-backend.md).
#pragma once

#include <memory>
#include <span>

#include "rdmabuf/backend.h"

namespace rdmabuf {

struct BackendFactory {
  const char* name;
  TransportLevel level;
  // The backend, or a status saying why it is not viable here.
  Result<std::unique_ptr<Backend>> (*create)(const BackendEnv& env);
};

std::span<const BackendFactory> backend_factories();

}  // namespace rdmabuf
