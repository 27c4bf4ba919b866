#include "tests/helpers/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace rdmabuf::testing {
namespace {

using Clock = std::chrono::steady_clock;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

std::unique_ptr<Subprocess> Subprocess::spawn(const std::string& path,
                                              const std::vector<std::string>& args,
                                              const std::vector<std::string>& env,
                                              std::string* error) {
  // A write to the stdin of a child that died must fail, not kill the test.
  static const bool sigpipe_ignored = [] { return ::signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();
  (void)sigpipe_ignored;

  // Everything the child needs is built before fork: between fork and exec
  // only async-signal-safe calls are allowed (the parent has threads).
  std::vector<std::string> argv_store{path};
  argv_store.insert(argv_store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_store)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& o : env)
      overridden |= std::string_view(o).substr(0, o.find('=')) == name;
    if (!overridden) env_store.emplace_back(entry);
  }
  env_store.insert(env_store.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_store)
    envp.push_back(e.data());
  envp.push_back(nullptr);

  // O_CLOEXEC: children spawned concurrently must not inherit each other's
  // pipes (a stray write end would keep a peer's stdin from ever hitting EOF).
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) {
    *error = std::string("pipe2: ") + std::strerror(errno);
    return nullptr;
  }
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    *error = std::string("pipe2: ") + std::strerror(errno);
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return nullptr;
  }
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    *error = std::string("fork: ") + std::strerror(errno);
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]})
      ::close(fd);
    return nullptr;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died already
    ::dup2(in_pipe[0], STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::execve(path.c_str(), argv.data(), envp.data());
    static const char kMsg[] = "Subprocess: execve failed\n";
    ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    (void)ignored;
    ::_exit(127);
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;
  p->stdin_fd_ = in_pipe[1];
  p->stdout_fd_ = out_pipe[0];
  return p;
}

Subprocess::~Subprocess() {
  kill_and_reap();
  close_fd(stdin_fd_);
  close_fd(stdout_fd_);
}

std::optional<std::string> Subprocess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (stdout_eof_ || stdout_fd_ < 0) return std::nullopt;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{stdout_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;  // re-check the deadline
    char buf[4096];
    ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      stdout_eof_ = true;
      continue;
    }
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

bool Subprocess::write_line(std::string_view line) {
  if (stdin_fd_ < 0) return false;
  std::string data(line);
  data += '\n';
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    // SIGPIPE is ignored (see spawn), so a dead child shows up as EPIPE.
    ssize_t n = ::write(stdin_fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

void Subprocess::close_stdin() {
  close_fd(stdin_fd_);
}

bool Subprocess::signal(int sig) {
  if (reaped_) return false;
  return ::kill(pid_, sig) == 0;
}

bool Subprocess::stop(std::chrono::milliseconds timeout) {
  if (!signal(SIGSTOP)) return false;
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    int status = 0;
    // WUNTRACED reports the stop once the whole thread group has stopped.
    pid_t r = ::waitpid(pid_, &status, WUNTRACED | WNOHANG);
    if (r == pid_) {
      if (WIFSTOPPED(status)) return true;
      reaped_ = true;  // it exited instead
      status_ = status;
      return false;
    }
    if (r < 0 && errno != EINTR) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

std::optional<int> Subprocess::wait(std::chrono::milliseconds timeout) {
  if (reaped_) return status_;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      status_ = status;
      return status;
    }
    if (r < 0 && errno != EINTR) {
      reaped_ = true;  // not our child any more; nothing to reap
      return std::nullopt;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void Subprocess::kill_and_reap() {
  if (reaped_ || pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  // SIGKILL also ends a stopped process; the wait cannot take long.
  wait(std::chrono::seconds(30));
}

}  // namespace rdmabuf::testing
