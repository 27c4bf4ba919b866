#include "core/backend_table.h"

#include "backends/memory/memory_backend.h"
#include "backends/tcp/tcp_backend.h"

namespace rdmabuf {

std::span<const BackendFactory> backend_factories() {
  static const BackendFactory kFactories[] = {
      {"memory", TransportLevel::kMemory, &memory::make_memory_backend},
      {"tcp", TransportLevel::kTcp, &tcp::make_tcp_backend},
  };
  return kFactories;
}

}  // namespace rdmabuf
