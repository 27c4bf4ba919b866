// Runs test code on a thread pinned to one CPU, for what depends on where a
// thread may run (usable_cpus, the shared rings' waiter-CPU hint).
#pragma once

#include <sched.h>

#include <thread>

namespace rdmabuf::testing {

// Runs `what` on a thread of its own pinned to `cpu`: false, and `what` not
// run, when this environment does not let a thread be pinned there (a
// sandbox may forbid it).
template <typename What>
bool RunOnCpu(int cpu, What what) {
  bool pinned = false;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0 || sched_getcpu() != cpu) return;
    pinned = true;
    what();
  }).join();
  return pinned;
}

}  // namespace rdmabuf::testing
