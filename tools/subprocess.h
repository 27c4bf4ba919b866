// Child processes for the bench: the peer (`rdmabuf serve`) and the
// comparison tools (iperf3). Children die with the parent (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "rdmabuf/status.h"

namespace rdmabuf::tool {

class Child {
 public:
  struct Options {
    bool capture_stdout = true;
    bool quiet_stderr = false;
    std::vector<std::pair<std::string, std::string>> env;  // set in the child
  };

  // Starts argv[0] (looked up on PATH) with `argv`.
  static Result<Child> spawn(const std::vector<std::string>& argv, const Options& options);

  Child() = default;
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  ~Child();

  pid_t pid() const { return pid_; }
  // One line of stdout (without the newline); kDeadlineExceeded on timeout,
  // kUnavailable at end of output.
  Result<std::string> read_line(std::chrono::milliseconds timeout);
  // All of stdout until the child closes it.
  Result<std::string> read_all(std::chrono::milliseconds timeout);
  // Waits for the exit status (the code, or 128+signal).
  int wait();
  // SIGTERM, then SIGKILL if it has not exited after `grace`; reaps it.
  void terminate(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

 private:
  pid_t pid_ = -1;
  Fd out_;
  std::string buffered_;
};

// True when `program` is found on PATH.
bool on_path(const std::string& program);

// The Python interpreter the benchmarks run: RDMABUF_BENCH_PYTHON, else the
// one this build's Python package is for, else python3 on PATH.
std::string bench_python();

}  // namespace rdmabuf::tool
