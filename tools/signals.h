// Signals the tool's long-running commands (serve, the soak's children)
// stop on.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace rdmabuf::tool {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread, and so in every
// thread it starts afterwards, and returns the set for sigwait. Call it
// before Manager::create: library threads inherit the mask, so the signals
// then reach the sigwait and not a library thread (docs/threads.md).
inline sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace rdmabuf::tool
