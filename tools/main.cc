// rdmabuf: inspect, serve, read, write, benchmark and soak-test remote buffers.
// Each command prints its own help (`rdmabuf COMMAND --help`), kept beside
// its option parsing; this file holds the overview and the dispatch.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rdmabuf/version.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace {

constexpr const char* kUsage = R"(usage: rdmabuf COMMAND [OPTIONS]

commands:
  info               version, backends (viable or not, and why), configuration
  serve              register one buffer, print its handle, serve until killed
  read HANDLE        write the remote bytes to stdout
  write HANDLE       write stdin into the remote buffer
  bench              bandwidth, latency and op rate of reads and writes
                     against a peer process, beside iperf3, UCX and perftest
  bench --op send    endpoint messages beside UCX (and perftest)
  bench --op notify  tagged writes and their notifications beside UCX
  bench --compare    every viable backend beside iperf3, qperf, UCX, memcpy
                     and perftest; writes a table, JSON and a plot
  bench --gpu        GPU memory on one host beside torch's copy, and over
                     tcp beside host memory
  bench --pattern P  collective patterns across ranks and hosts beside
                     torch.distributed (gloo)
  soak               a long, verified load from several client processes;
                     fails on errors, hangs or owner memory and fds that grow
  version            the version (also --version)

`rdmabuf COMMAND --help` (or `rdmabuf help COMMAND`) shows a command's
options and their defaults. Sizes take K/M/G suffixes (binary).
Configuration comes from RDMABUF_* variables; `rdmabuf info` shows what is
in effect. Exit status: 0 done, 1 failed, 2 bad command line.
)";

constexpr const char* kVersionHelp = R"(usage: rdmabuf version
       rdmabuf --version

Prints "rdmabuf VERSION", the version of the tool and of the library it
runs on.

options:
  -h, --help   this text

exit status: 0.
)";

int dispatch(int argc, char** argv) {
  using namespace rdmabuf::tool;
  const std::string command = argv[1];
  if (command == "info") return cmd_info(argc, argv);
  if (command == "serve") return cmd_serve(argc, argv);
  if (command == "read") return cmd_read(argc, argv);
  if (command == "write") return cmd_write(argc, argv);
  if (command == "bench") return cmd_bench(argc, argv);
  if (command == "soak") return cmd_soak(argc, argv);
  if (command == "--version" || command == "version") {
    if (wants_help(argc, argv)) return print_help(kVersionHelp);
    std::printf("rdmabuf %s\n", rdmabuf::version());
    return kExitOk;
  }
  if (command == "-h" || command == "--help" || command == "help") {
    if (command == "help" && argc > 2) {
      // `rdmabuf help COMMAND [ARGS]`: `rdmabuf COMMAND [ARGS] --help`.
      std::vector<char*> args(argv, argv + argc);
      args.erase(args.begin() + 1);
      char help[] = "--help";
      args.push_back(help);
      args.push_back(nullptr);
      return dispatch(argc, args.data());
    }
    return print_help(kUsage);
  }
  std::fprintf(stderr, "rdmabuf: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return rdmabuf::tool::kExitUsage;
  }
  return dispatch(argc, argv);
}
