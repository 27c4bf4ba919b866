// rdmabuf info: version, every backend with viability and reason, the
// configuration in effect.
#include <cstdio>

#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace rdmabuf::tool {
namespace {

constexpr const char* kHelp = R"(usage: rdmabuf info

Prints the version; every backend, best first, with its transport level,
whether it is viable here (and why not) and its details; the CUDA driver
and the GPUs it sees (or why GPU memory cannot be used here); this
manager's identity; and the configuration in effect (RDMABUF_* variables
over the defaults). Nothing is registered or sent.

options:
  -h, --help   this text

exit status: 0; 1 when no manager could start (the reason is printed, and
the configuration still is); 2 for a bad command line or RDMABUF_*
variable.
)";

}  // namespace

int cmd_info(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kHelp);
  auto args = parse_args(argc, argv, 2, {}, {});
  if (!args.ok()) return fail(args.status());
  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  std::printf("rdmabuf %s\n\n", version());
  auto manager = Manager::create(*config);
  std::printf("backends (best first):\n");
  if (!manager.ok()) {
    std::printf("  (no manager could start: %s)\n", manager.status().to_string().c_str());
  } else {
    for (const BackendInfo& b : (*manager)->backends()) {
      std::printf("  %-8s level %-6s %s%s%s\n", b.name.c_str(), transport_level_name(b.level),
                  b.viable ? "viable" : "not viable", b.reason.empty() ? "" : ": ",
                  b.reason.c_str());
      for (const auto& [key, value] : b.details) {
        std::printf("           %s: %s\n", key.c_str(), value.c_str());
      }
    }
    std::printf("\nthis manager: %s\n", (*manager)->identity().to_string().c_str());
  }
  const GpuSupport gpu = gpu_support();
  std::printf("\nGPU memory: ");
  if (!gpu.status.ok()) {
    std::printf("not usable: %s\n", gpu.status.message().c_str());
  } else {
    std::printf("CUDA driver %d.%d (%s)\n", gpu.driver_version / 1000,
                gpu.driver_version % 1000 / 10, gpu.driver.c_str());
    for (const GpuInfo& g : gpu.gpus) {
      std::printf("  cuda:%d  %s, %s, PCI %s\n", g.ordinal, g.name.c_str(),
                  format_bytes(g.memory).c_str(), g.pci_bus_id.c_str());
    }
  }
  std::printf("\nconfiguration (RDMABUF_* environment over defaults):\n");
  for (const auto& [key, value] : config->describe()) {
    std::printf("  %-20s %s\n", key.c_str(), value.c_str());
  }
  return manager.ok() ? kExitOk : kExitFailed;
}

}  // namespace rdmabuf::tool
