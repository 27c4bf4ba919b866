// Child processes for multi-process tests: fork/exec with pipes to the
// child's stdin and from its stdout, line reads with a timeout, signals, and
// waits with a timeout. A Subprocess that is destroyed while its child runs
// kills the child (SIGKILL) and reaps it, so no test leaks processes, even
// when an assertion returns early.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdmabuf::testing {

class Subprocess {
 public:
  // Starts `path` with `args` (argv[1..]) and the current environment plus
  // `env` ("NAME=VALUE" entries, which override). The child's stderr is
  // shared with this process so its logs show in test output. The child is
  // also sent SIGKILL if the thread that spawned it dies (PR_SET_PDEATHSIG),
  // so spawn from the test's main thread. Null (and `*error` set) on failure.
  static std::unique_ptr<Subprocess> spawn(const std::string& path,
                                           const std::vector<std::string>& args,
                                           const std::vector<std::string>& env, std::string* error);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // One line of the child's stdout without its '\n'; nullopt on timeout or
  // when the child closed its stdout first.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  // Writes `line` and a '\n' to the child's stdin. False when the pipe broke.
  bool write_line(std::string_view line);
  void close_stdin();

  // kill(2); false when the child is already reaped.
  bool signal(int sig);
  // SIGSTOP, then waits until every thread of the child has stopped (kill(2)
  // returns before that happens). False if it did not stop in `timeout`.
  bool stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // SIGCONT.
  bool resume() { return signal(SIGCONT); }
  // Waits for the child to exit; its wait status, or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // SIGKILL and reap (no-op once reaped).
  void kill_and_reap();
  bool reaped() const { return reaped_; }

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
  bool stdout_eof_ = false;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace rdmabuf::testing
