// The threads of a process, from /proc, for tests that check that threads
// do not grow with peers.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace rdmabuf::testing {

// The number of threads of process `pid` (this one by default); -1 when
// it cannot be read.
inline int threads_of(pid_t pid = ::getpid()) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("Threads:")) return std::stoi(line.substr(8));
  }
  return -1;
}

// Each thread's name, for this process.
inline std::vector<std::string> thread_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.push_back(name);
  }
  return names;
}

// How many threads of this process are named `name`.
inline int threads_named(const std::string& name) {
  const auto names = thread_names();
  return static_cast<int>(std::count(names.begin(), names.end(), name));
}

// Waits up to `timeout` until exactly `count` threads are named `name`.
inline bool wait_for_threads_named(const std::string& name, int count,
                                   std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (threads_named(name) != count) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace rdmabuf::testing
