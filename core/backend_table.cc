#include "core/backend_table.h"

#include "backends/memory/memory_backend.h"
#include "backends/tcp/tcp_backend.h"
#ifdef RDMABUF_HAVE_IBVERBS
#include "backends/ibverbs/ibverbs_backend.h"
#endif

namespace rdmabuf {
namespace {

#ifdef RDMABUF_HAVE_IBVERBS
constexpr auto kIbverbs = &ibverbs::make_ibverbs_backend;
#else
Result<std::unique_ptr<Backend> > kIbverbs(const BackendEnv&) {
  return FailedPrecondition(
      "this rdmabuf was built without ibverbs (install libibverbs-dev and rebuild)");
}
#endif

}  // namespace

std::span<const BackendFactory> backend_factories() {
  static const BackendFactory kFactories[] = {
      {"memory", TransportLevel::kMemory, &memory::make_memory_backend},
      {"ibverbs", TransportLevel::kNic, kIbverbs},
      {"tcp", TransportLevel::kTcp, &tcp::make_tcp_backend},
  };
  return kFactories;
}

}  // namespace rdmabuf
