// rdmabuf: inspect, serve, read, write, benchmark and soak-test remote buffers.
#include <cstdio>
#include <cstring>
#include <string>

#include "rdmabuf/version.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace {

constexpr const char* kUsage = R"(usage: rdmabuf COMMAND [OPTIONS]

commands:
  info                          version, backends (viable or not, and why), configuration
  serve [--size BYTES] [--pattern seq|zero|random] [--listen HOST:PORT]
                                register one buffer, print its handle, serve until killed
  read HANDLE [--offset N] [--length N]
                                write the remote bytes to stdout
  write HANDLE [--offset N]     write stdin into the remote buffer
  bench [--backend NAME] [--sizes LIST] [--batch N] [--streams N] [--iters N]
        [--window BYTES] [--connect HANDLE] [--peer auto|none] [--json]
                                measure bandwidth, latency and op rate against a peer
                                process (started here unless --connect is given)
  bench --op send|notify [--backend NAME] [--sizes LIST] [--iters N] [--rounds N]
        [--window N] [--peer auto|none] [--json]
                                endpoint messages (send) or tagged writes and their
                                notifications (notify) beside UCX (and perftest)
  soak [--seconds N] [--backend NAME] [--clients N] [--inflight N] [--max-size BYTES]
       [--buffers N] [--seed N] [--json]
                                load one owner process from several clients over every
                                viable backend at once, check every byte, fail on errors,
                                hangs or owner memory and fds that grow

Sizes take K/M/G suffixes (binary). Configuration comes from RDMABUF_* variables;
`rdmabuf info` shows what is in effect.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace rdmabuf::tool;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  std::string command = argv[1];
  for (int i = 2; i < argc; ++i) {  // `rdmabuf COMMAND --help`
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
  }
  if (command == "info") return cmd_info(argc, argv);
  if (command == "serve") return cmd_serve(argc, argv);
  if (command == "read") return cmd_read(argc, argv);
  if (command == "write") return cmd_write(argc, argv);
  if (command == "bench") return cmd_bench(argc, argv);
  if (command == "soak") return cmd_soak(argc, argv);
  if (command == "--version" || command == "version") {
    std::printf("rdmabuf %s\n", rdmabuf::version());
    return kExitOk;
  }
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  std::fprintf(stderr, "rdmabuf: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return kExitUsage;
}
