#include "tools/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

namespace rdmabuf::tool {

Result<Child> Child::spawn(const std::vector<std::string>& argv, const Options& options) {
  int pipe_fds[2] = {-1, -1};
  if (options.capture_stdout && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return ResourceExhausted("pipe: " + errno_text(errno));
  }
  pid_t parent = getpid();
  pid_t pid = ::fork();
  if (pid < 0) return ResourceExhausted("fork: " + errno_text(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    if (options.capture_stdout) dup2(pipe_fds[1], STDOUT_FILENO);
    if (options.quiet_stderr) {
      int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, STDERR_FILENO);
      if (!options.capture_stdout && null >= 0) dup2(null, STDOUT_FILENO);
    }
    for (const auto& [key, value] : options.env)
      setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  Child child;
  child.pid_ = pid;
  if (options.capture_stdout) {
    ::close(pipe_fds[1]);
    child.out_ = Fd(pipe_fds[0]);
  }
  return child;
}

Child::Child(Child&& other) noexcept {
  *this = std::move(other);
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    terminate();
    pid_ = std::exchange(other.pid_, -1);
    out_ = std::move(other.out_);
    buffered_ = std::move(other.buffered_);
  }
  return *this;
}

Child::~Child() {
  terminate();
}

Result<std::string> Child::read_line(std::chrono::milliseconds timeout) {
  Deadline deadline = Clock::now() + timeout;
  while (true) {
    size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (!out_.valid()) return Unavailable("the child's output has ended");
    Status ready = wait_fd(out_.get(), POLLIN, deadline);
    if (!ready.ok()) return ready;
    char buf[4096];
    ssize_t n = ::read(out_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      out_.reset();
      continue;
    }
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

Result<std::string> Child::read_all(std::chrono::milliseconds timeout) {
  Deadline deadline = Clock::now() + timeout;
  while (out_.valid()) {
    Status ready = wait_fd(out_.get(), POLLIN, deadline);
    if (!ready.ok()) return ready;
    char buf[4096];
    ssize_t n = ::read(out_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffered_.append(buf, static_cast<size_t>(n));
  }
  out_.reset();
  return std::exchange(buffered_, std::string());
}

int Child::wait() {
  if (pid_ < 0) return -1;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

void Child::terminate(std::chrono::milliseconds grace) {
  if (pid_ < 0) return;
  ::kill(pid_, SIGTERM);
  auto until = Clock::now() + grace;
  int status = 0;
  while (Clock::now() < until) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid_, SIGKILL);
  wait();
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string all = path;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    std::string candidate = all.substr(start, end - start) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

std::string bench_python() {
  const char* chosen = std::getenv("RDMABUF_BENCH_PYTHON");
  if (chosen && *chosen) return chosen;
#ifdef RDMABUF_PYTHON_EXECUTABLE
  return RDMABUF_PYTHON_EXECUTABLE;
#else
  return "python3";
#endif
}

}  // namespace rdmabuf::tool
