// rdmabuf serve: register one buffer, print its handle, serve until killed.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common/host.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/pattern.h"
#include "tools/signals.h"

namespace rdmabuf::tool {

int cmd_serve(int argc, char** argv) {
  auto args = parse_args(argc, argv, 2, {"size", "pattern", "listen"}, {});
  if (!args.ok()) return fail(args.status());
  if (!args->positional.empty())
    return fail(InvalidArgument("serve takes no positional arguments"));
  auto size = args->size("size", 64 << 20);
  if (!size.ok()) return fail(size.status());
  std::string pattern = args->get("pattern").value_or("seq");
  if (pattern != "seq" && pattern != "zero" && pattern != "random") {
    return fail(InvalidArgument("--pattern must be seq, zero or random"));
  }
  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  if (auto listen = args->get("listen")) config->listen_address = *listen;

  // Before any thread starts, so that the signals reach sigwait below.
  sigset_t stop_signals = block_stop_signals();

  auto manager = Manager::create(*config);
  if (!manager.ok()) return fail(manager.status());
  auto memory = LocalMemory::allocate(*size);
  if (!memory.ok()) return fail(memory.status());
  if (pattern == "seq") fill_seq(memory->span(), 0);
  if (pattern == "random") fill_random(memory->span(), secure_random_u64());
  auto handle = (*manager)->register_buffer(*memory);
  if (!handle.ok()) return fail(handle.status());
  std::printf("%s\n", handle->to_text().c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "rdmabuf: serving %llu bytes (%s) as buffer %llu of %s; Ctrl-C stops\n",
               static_cast<unsigned long long>(*size), pattern.c_str(),
               static_cast<unsigned long long>(handle->id()),
               (*manager)->identity().to_string().c_str());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  (*manager)->shutdown();
  return kExitOk;
}

}  // namespace rdmabuf::tool
